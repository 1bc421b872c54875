"""Performance against a peer measured in the same run, on CPU or an accelerator."""

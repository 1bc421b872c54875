"""The accelerator report and the GPU decode kernel's launch plans (bench/gpu_checks.sh)."""

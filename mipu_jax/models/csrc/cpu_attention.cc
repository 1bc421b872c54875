// Fused softmax attention for XLA:CPU, forward and backward, through jax's FFI.
//
// Written here because nothing maintained fuses attention for jax on a CPU:
// XLA:CPU runs `attention._dense` as separate batched dots, mask, softmax and
// layout copies, and Pallas kernels run on a CPU only interpreted.
//
// The math is `attention._dense` (docs/method.md §7b): scores = q.k * scale,
// masked to NEG_INF (float32's lowest), softmax over keys, then probs.v;
// a row with no valid key gets the uniform average of all values, as there.
// One work item is a (batch row, key-value head) pair: its keys and values are
// copied once into contiguous tiles, and every query head of the group reads
// them. Masked keys outside a row's first..last valid key are skipped (their
// probability is exactly 0 in `_dense` too). The backward recomputes the
// probabilities from the forward's log-sum-exp (flash attention's scheme).
// float32 only; the Python side checks shapes and dtypes before the call, and
// the handlers check the shapes again.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr float kNegInf = std::numeric_limits<float>::lowest();

// 16 floats: one AVX-512 register, two AVX2 ones (GCC / Clang vector extension,
// so the same source builds for whatever `-march=native` the host has).
typedef float V16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t I16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kW = 16;  // floats per V16
constexpr int64_t kR = 8;   // query rows per block (register tile)

inline V16 Load(const float* p) { return *reinterpret_cast<const V16*>(p); }
inline void Store(float* p, V16 v) { *reinterpret_cast<V16*>(p) = v; }
inline V16 Splat(float x) { return V16{} + x; }

// exp of 16 lanes x <= 0 (scores minus their row max or log-sum-exp): Cephes'
// expf polynomial in plain vector arithmetic (libm's expf does not vectorize
// without -ffast-math). Relative error ~2e-7; below -87, ~1e-38 instead of 0.
inline V16 Exp(V16 x) {
  x = x < Splat(-87.0f) ? Splat(-87.0f) : x;  // a NaN lane stays NaN
  const V16 big = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V16 n = (x * 1.44269504088896341f + big) - big;
  V16 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V16 p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I16 bits = (__builtin_convertvector(n, I16) + 127) << 23;
  V16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// A NaN score need not survive the max: its exponential is NaN (`Exp` keeps it), so
// the row's sum and output are NaN, as `_dense`'s softmax gives.
inline float MaxOf(V16 v) {
  float m = v[0];
  for (int i = 1; i < kW; ++i) m = std::max(m, v[i]);
  return m;
}

inline float SumOf(V16 v) {
  float s = 0.0f;
  for (int i = 0; i < kW; ++i) s += v[i];
  return s;
}

struct Dims {
  int64_t b, t, s, n, kh, h, g;  // batch, queries, keys, heads, kv heads, head dim, group
  int64_t sp, hp;                // keys and head dim padded to multiples of kW (zeros)
};

// First and one-past-last valid key of a mask row; lo == hi when none is.
inline void ValidRange(const bool* m, int64_t s, int64_t* lo, int64_t* hi) {
  int64_t a = 0, z = s;
  while (a < s && !m[a]) ++a;
  while (z > a && !m[z - 1]) --z;
  *lo = a;
  *hi = z;
}

// Runs `fn(item)` for items 0..count-1 on XLA's intra-op pool and the calling
// thread. Items are claimed from a shared counter, and the caller waits only
// for claimed items, so a pool that never runs a scheduled task (all threads
// busy, or the caller itself the only worker) cannot deadlock the call.
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t count, F fn) {
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto* f = &fn;
  // A late task finds the counter spent and touches neither `fn` nor the
  // call's buffers: it only reads `state`, which it co-owns.
  auto work = [state, f, count]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < count;) {
      (*f)(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), count) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(work)(work));
  work();
  while (state->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

// out[r][j] = sum_x a[r][x] * bt[x][j] for the kR rows of `a` ([kR, hp]) and keys
// j0..j1 (multiples of kW) of the transposed tile `bt` ([hp, sp]); out is [kR, sp].
inline void RowsByKeys(const float* a, const float* bt, const Dims& d, int64_t j0, int64_t j1,
                       float* out) {
  for (int64_t j = j0; j < j1; j += kW) {
    V16 acc[kR] = {};
    for (int64_t x = 0; x < d.hp; ++x) {
      const V16 bv = Load(bt + x * d.sp + j);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kR; ++r) acc[r] += a[r * d.hp + x] * bv;
    }
    for (int64_t r = 0; r < kR; ++r) Store(out + r * d.sp + j, acc[r]);
  }
}

// out[r][:] = sum_j w[r][j] * b[j][:] over keys j0..j1 of the tile `b` ([sp, hp]);
// w is [kR, sp], out [kR, hp].
inline void WeightsByRows(const float* w, const float* b, const Dims& d, int64_t j0,
                          int64_t j1, float* out) {
  for (int64_t c = 0; c < d.hp; c += kW) {
    V16 acc[kR] = {};
    for (int64_t j = j0; j < j1; ++j) {
      const V16 bv = Load(b + j * d.hp + c);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kR; ++r) acc[r] += w[r * d.sp + j] * bv;
    }
    for (int64_t r = 0; r < kR; ++r) Store(out + r * d.hp + c, acc[r]);
  }
}

// acc[j][:] += sum_r w[r][j] * a[r][:] for keys j0..j1: a key tile's gradient
// from the kR rows of `a` ([kR, hp]); w is [kR, sp], acc [sp, hp].
inline void KeysFromRows(const float* w, const float* a, const Dims& d, int64_t j0, int64_t j1,
                         float* acc) {
  for (int64_t c = 0; c < d.hp; c += kW) {
    V16 ar[kR];
    for (int64_t r = 0; r < kR; ++r) ar[r] = Load(a + r * d.hp + c);
    for (int64_t j = j0; j < j1; ++j) {
      V16 sum = Load(acc + j * d.hp + c);
#pragma GCC unroll 8
      for (int64_t r = 0; r < kR; ++r) sum += w[r * d.sp + j] * ar[r];
      Store(acc + j * d.hp + c, sum);
    }
  }
}

// One (batch row, kv head) item's tiles: keys and values as [sp, hp] and
// transposed [hp, sp], zero past S and H.
struct Tiles {
  std::vector<float> k, kt, v, vt;
  Tiles(const float* kp, const float* vp, const Dims& d, int64_t bi, int64_t ki)
      : k(d.sp * d.hp, 0.0f), kt(d.hp * d.sp, 0.0f), v(d.sp * d.hp, 0.0f), vt(d.hp * d.sp, 0.0f) {
    for (int64_t j = 0; j < d.s; ++j) {
      const float* kr = kp + ((bi * d.s + j) * d.kh + ki) * d.h;
      const float* vr = vp + ((bi * d.s + j) * d.kh + ki) * d.h;
      for (int64_t x = 0; x < d.h; ++x) {
        k[j * d.hp + x] = kr[x];
        kt[x * d.sp + j] = kr[x];
        v[j * d.hp + x] = vr[x];
        vt[x * d.sp + j] = vr[x];
      }
    }
  }
};

// A block of kR query rows t0.. (shared by the heads of a group): each row's
// valid key range, the block's key range [j0, j1) (rounded out to kW) covering
// every non-empty row, and the mask as 1 / 0 floats `on` ([kR, sp]) over it.
struct Block {
  int64_t lo[kR], hi[kR], j0, j1;
  bool any;
  std::vector<float> on;
  explicit Block(const Dims& d) : on(kR * d.sp, 0.0f) {}
  void Fill(const bool* mp, const Dims& d, int64_t bi, int64_t t0) {
    j0 = d.sp;
    j1 = 0;
    any = false;
    for (int64_t r = 0; r < kR; ++r) {
      lo[r] = hi[r] = 0;
      if (t0 + r >= d.t) continue;
      ValidRange(mp + (bi * d.t + t0 + r) * d.s, d.s, &lo[r], &hi[r]);
      if (lo[r] < hi[r]) {
        any = true;
        j0 = std::min(j0, lo[r]);
        j1 = std::max(j1, hi[r]);
      }
    }
    j0 = any ? j0 / kW * kW : 0;
    j1 = any ? (j1 + kW - 1) / kW * kW : 0;
    for (int64_t r = 0; r < kR; ++r) {
      float* o = on.data() + r * d.sp;
      if (t0 + r >= d.t) {
        std::fill(o + j0, o + j1, 0.0f);
        continue;
      }
      const bool* m = mp + (bi * d.t + t0 + r) * d.s;
      for (int64_t j = j0; j < j1; ++j) o[j] = (j >= lo[r] && j < hi[r] && m[j]) ? 1.0f : 0.0f;
    }
  }
};

// Copies kR rows of head `ni` (rows t0..) from [B, T, N, H] into a [kR, hp] block
// (zeros past T; the columns past H are never written, so stay 0).
inline void GatherRows(const float* x, const Dims& d, int64_t bi, int64_t ni, int64_t t0,
                       float* out) {
  for (int64_t r = 0; r < kR; ++r) {
    if (t0 + r < d.t)
      std::memcpy(out + r * d.hp, x + ((bi * d.t + t0 + r) * d.n + ni) * d.h,
                  d.h * sizeof(float));
    else
      std::fill(out + r * d.hp, out + (r + 1) * d.hp, 0.0f);
  }
}

ffi::Unexpected<ffi::Error> Invalid(const char* what) {
  return ffi::Unexpected<ffi::Error>(ffi::Error::InvalidArgument(what));
}

// The call's dimensions, or an error when q [B, T, N, H], k and v [B, S, K, H]
// and the mask [B, T, S] do not fit together.
ffi::ErrorOr<Dims> GetDims(const ffi::Buffer<ffi::F32>& q, const ffi::Buffer<ffi::F32>& k,
                           const ffi::Buffer<ffi::F32>& v, const ffi::Buffer<ffi::PRED>& mask) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  auto md = mask.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4 || md.size() != 3)
    return Invalid("cpu_attention: q, k, v must be 4-D and the mask 3-D");
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i]) return Invalid("cpu_attention: k and v differ");
  if (kd[0] != qd[0] || kd[3] != qd[3] || kd[2] == 0 || qd[2] % kd[2] != 0 ||
      md[0] != qd[0] || md[1] != qd[1] || md[2] != kd[1])
    return Invalid("cpu_attention: q [B,T,N,H], k [B,S,K,H], mask [B,T,S]");
  Dims d{qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], qd[2] / kd[2], 0, 0};
  d.sp = (d.s + kW - 1) / kW * kW;
  d.hp = (d.h + kW - 1) / kW * kW;
  return d;
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                   ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask, float scale,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse) {
  const auto dims = GetDims(q, k, v, mask);
  if (dims.has_error()) return dims.error();
  const Dims d = dims.value();
  const bool* mp = mask.typed_data();
  const float* qp = q.typed_data();
  float* op = out->typed_data();
  float* lp = lse->typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  ParallelFor(pool, d.b * d.kh, [&](int64_t item) {
    const int64_t bi = item / d.kh, ki = item % d.kh;
    const Tiles tiles(kp, vp, d, bi, ki);
    std::vector<float> qb(kR * d.hp), sc(kR * d.sp, 0.0f), ob(kR * d.hp), mean(d.h, 0.0f);
    for (int64_t j = 0; j < d.s; ++j)  // a row with no valid key: `_dense`'s uniform softmax
      for (int64_t x = 0; x < d.h; ++x) mean[x] += tiles.v[j * d.hp + x] / static_cast<float>(d.s);
    Block blk(d);
    for (int64_t t0 = 0; t0 < d.t; t0 += kR) {
      blk.Fill(mp, d, bi, t0);
      for (int64_t g = 0; g < d.g; ++g) {
        const int64_t ni = ki * d.g + g;
        GatherRows(qp, d, bi, ni, t0, qb.data());
        RowsByKeys(qb.data(), tiles.kt.data(), d, blk.j0, blk.j1, sc.data());
        float lsum[kR];
        for (int64_t r = 0; r < kR; ++r) {
          float* p = sc.data() + r * d.sp;
          const float* on = blk.on.data() + r * d.sp;
          lsum[r] = kNegInf;
          if (blk.lo[r] == blk.hi[r]) {
            std::fill(p + blk.j0, p + blk.j1, 0.0f);
            continue;
          }
          V16 vm = Splat(kNegInf);
          for (int64_t j = blk.j0; j < blk.j1; j += kW) {
            V16 x = Load(p + j) * scale;
            x = Load(on + j) > 0.0f ? x : Splat(kNegInf);
            Store(p + j, x);
            vm = vm > x ? vm : x;
          }
          const float mx = MaxOf(vm);
          V16 vs = {};
          for (int64_t j = blk.j0; j < blk.j1; j += kW) {
            const V16 e = Load(on + j) > 0.0f ? Exp(Load(p + j) - mx) : Splat(0.0f);
            Store(p + j, e);
            vs += e;
          }
          const float sum = SumOf(vs), inv = 1.0f / sum;
          for (int64_t j = blk.j0; j < blk.j1; j += kW) Store(p + j, Load(p + j) * inv);
          lsum[r] = mx + std::log(sum);
        }
        WeightsByRows(sc.data(), tiles.v.data(), d, blk.j0, blk.j1, ob.data());
        for (int64_t r = 0; r < kR && t0 + r < d.t; ++r) {
          const float* src = blk.lo[r] < blk.hi[r] ? ob.data() + r * d.hp : mean.data();
          std::memcpy(op + ((bi * d.t + t0 + r) * d.n + ni) * d.h, src, d.h * sizeof(float));
          lp[(bi * d.n + ni) * d.t + t0 + r] = lsum[r];
        }
      }
    }
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                    ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::PRED> mask,
                    ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                    ffi::Buffer<ffi::F32> dout, float scale, ffi::ResultBuffer<ffi::F32> dq,
                    ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv) {
  const auto dims = GetDims(q, k, v, mask);
  if (dims.has_error()) return dims.error();
  const Dims d = dims.value();
  const bool* mp = mask.typed_data();
  const float* qp = q.typed_data();
  const float* op = out.typed_data();
  const float* lp = lse.typed_data();
  const float* dop = dout.typed_data();
  const float* kp = k.typed_data();
  const float* vp = v.typed_data();
  float* dqp = dq->typed_data();
  float* dkp = dk->typed_data();
  float* dvp = dv->typed_data();
  ParallelFor(pool, d.b * d.kh, [&](int64_t item) {
    const int64_t bi = item / d.kh, ki = item % d.kh;
    const Tiles tiles(kp, vp, d, bi, ki);
    std::vector<float> dkl(d.sp * d.hp, 0.0f), dvl(d.sp * d.hp, 0.0f), dsum_empty(d.h, 0.0f);
    std::vector<float> qb(kR * d.hp), ob(kR * d.hp), dob(kR * d.hp), dqb(kR * d.hp);
    std::vector<float> p(kR * d.sp, 0.0f), ds(kR * d.sp, 0.0f);
    Block blk(d);
    for (int64_t t0 = 0; t0 < d.t; t0 += kR) {
      blk.Fill(mp, d, bi, t0);
      for (int64_t g = 0; g < d.g; ++g) {
        const int64_t ni = ki * d.g + g;
        GatherRows(dop, d, bi, ni, t0, dob.data());
        for (int64_t r = 0; r < kR; ++r)  // rows with no valid key: uniform probabilities
          if (t0 + r < d.t && blk.lo[r] == blk.hi[r])
            for (int64_t x = 0; x < d.h; ++x) dsum_empty[x] += dob[r * d.hp + x];
        if (!blk.any) {
          for (int64_t r = 0; r < kR && t0 + r < d.t; ++r)
            std::fill_n(dqp + ((bi * d.t + t0 + r) * d.n + ni) * d.h, d.h, 0.0f);
          continue;
        }
        GatherRows(qp, d, bi, ni, t0, qb.data());
        GatherRows(op, d, bi, ni, t0, ob.data());
        RowsByKeys(qb.data(), tiles.kt.data(), d, blk.j0, blk.j1, p.data());
        RowsByKeys(dob.data(), tiles.vt.data(), d, blk.j0, blk.j1, ds.data());
        for (int64_t r = 0; r < kR; ++r) {
          float* pr = p.data() + r * d.sp;
          float* dr = ds.data() + r * d.sp;
          const float* on = blk.on.data() + r * d.sp;
          const bool empty = blk.lo[r] == blk.hi[r];
          const float l = empty ? 0.0f : lp[(bi * d.n + ni) * d.t + t0 + r];
          float dot = 0.0f;  // sum_j p_j (dO . v_j) = dO . O
          for (int64_t x = 0; x < d.h; ++x) dot += dob[r * d.hp + x] * ob[r * d.hp + x];
          for (int64_t j = blk.j0; j < blk.j1; j += kW) {
            const V16 pj = Load(on + j) > 0.0f ? Exp(Load(pr + j) * scale - l) : Splat(0.0f);
            Store(pr + j, pj);
            Store(dr + j, pj * (Load(dr + j) - dot) * scale);
          }
        }
        KeysFromRows(p.data(), dob.data(), d, blk.j0, blk.j1, dvl.data());
        KeysFromRows(ds.data(), qb.data(), d, blk.j0, blk.j1, dkl.data());
        WeightsByRows(ds.data(), tiles.k.data(), d, blk.j0, blk.j1, dqb.data());
        for (int64_t r = 0; r < kR && t0 + r < d.t; ++r) {
          float* dst = dqp + ((bi * d.t + t0 + r) * d.n + ni) * d.h;
          if (blk.lo[r] < blk.hi[r])
            std::memcpy(dst, dqb.data() + r * d.hp, d.h * sizeof(float));
          else
            std::fill_n(dst, d.h, 0.0f);
        }
      }
    }
    for (int64_t j = 0; j < d.s; ++j) {
      float* dkr = dkp + ((bi * d.s + j) * d.kh + ki) * d.h;
      float* dvr = dvp + ((bi * d.s + j) * d.kh + ki) * d.h;
      for (int64_t x = 0; x < d.h; ++x) {
        dkr[x] = dkl[j * d.hp + x];
        dvr[x] = dvl[j * d.hp + x] + dsum_empty[x] / static_cast<float>(d.s);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

// What both handlers take first: XLA's intra-op pool, q, k, v and the mask.
auto BindQkvMask() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::ThreadPool>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Arg<ffi::Buffer<ffi::PRED>>();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(MipuAttentionForward, Forward,
                              BindQkvMask()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()   // out
                                  .Ret<ffi::Buffer<ffi::F32>>());  // log-sum-exp

XLA_FFI_DEFINE_HANDLER_SYMBOL(MipuAttentionBackward, Backward,
                              BindQkvMask()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // out
                                  .Arg<ffi::Buffer<ffi::F32>>()   // log-sum-exp
                                  .Arg<ffi::Buffer<ffi::F32>>()   // d out
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dq
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dk
                                  .Ret<ffi::Buffer<ffi::F32>>());  // dv

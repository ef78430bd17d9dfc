// The AVX2 inner loops of the range pass. Each function carries target("avx2")
// rather than the file being built with -mavx2, so that the inline and template code
// it shares with the portable path is never compiled for AVX2 (which would break the
// one-definition rule on CPUs without it). BestKernels() calls in only where the CPU
// has AVX2.

#include <immintrin.h>

#include "core/dtype.h"
#include "core/range_kernels.h"

#define QPARAMS_AVX2 __attribute__((target("avx2")))
#define QPARAMS_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

namespace qparams::range_internal {
namespace {

// 256-bit vectors of a format's keys.
template <typename F>
struct Lanes;

template <uint32_t kExponentMask>
struct Lanes<Format<uint32_t, int32_t, kExponentMask>> {
  static constexpr int kCount = 8;
  QPARAMS_AVX2_INLINE static __m256i Key(__m256i u) {
    return _mm256_xor_si256(
        u, _mm256_and_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32(0x7fffffff)));
  }
  QPARAMS_AVX2_INLINE static __m256i Min(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
  QPARAMS_AVX2_INLINE static __m256i Max(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
  // Lane b of the result: the min (or max) over the lanes of v[b], for 8 vectors.
  template <bool kMax>
  QPARAMS_AVX2_INLINE static __m256i Transpose(const __m256i* v) {
    __m256i a[4], b[2];
    for (int i = 0; i < 4; ++i) {
      a[i] = Op<kMax>(_mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                      _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
    }
    for (int i = 0; i < 2; ++i) {
      b[i] = Op<kMax>(_mm256_unpacklo_epi64(a[2 * i], a[2 * i + 1]),
                      _mm256_unpackhi_epi64(a[2 * i], a[2 * i + 1]));
    }
    return Op<kMax>(_mm256_permute2x128_si256(b[0], b[1], 0x20),
                    _mm256_permute2x128_si256(b[0], b[1], 0x31));
  }
  template <bool kMax>
  QPARAMS_AVX2_INLINE static __m256i Op(__m256i a, __m256i b) {
    return kMax ? Max(a, b) : Min(a, b);
  }
  // Lanes whose min/max keys reveal a NaN or an infinity.
  template <typename F>
  QPARAMS_AVX2_INLINE static __m256i NonFinite(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_cmpgt_epi32(hi, _mm256_set1_epi32(F::kPositiveInfinityKey - 1)),
                           _mm256_cmpgt_epi32(_mm256_set1_epi32(F::kNegativeInfinityKey + 1), lo));
  }
  QPARAMS_AVX2_INLINE static int32_t HMin(__m256i v) {
    __m128i m = _mm_min_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_min_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_min_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(m);
  }
  QPARAMS_AVX2_INLINE static int32_t HMax(__m256i v) {
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(m);
  }
};

template <uint16_t kExponentMask>
struct Lanes<Format<uint16_t, int16_t, kExponentMask>> {
  static constexpr int kCount = 16;
  QPARAMS_AVX2_INLINE static __m256i Key(__m256i u) {
    return _mm256_xor_si256(u,
                            _mm256_and_si256(_mm256_srai_epi16(u, 15), _mm256_set1_epi16(0x7fff)));
  }
  QPARAMS_AVX2_INLINE static __m256i Min(__m256i a, __m256i b) { return _mm256_min_epi16(a, b); }
  QPARAMS_AVX2_INLINE static __m256i Max(__m256i a, __m256i b) { return _mm256_max_epi16(a, b); }
  // Lane b of the result: the min (or max) over the lanes of v[b], for 16 vectors.
  template <bool kMax>
  QPARAMS_AVX2_INLINE static __m256i Transpose(const __m256i* v) {
    __m256i a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) {
      a[i] = Op<kMax>(_mm256_unpacklo_epi16(v[2 * i], v[2 * i + 1]),
                      _mm256_unpackhi_epi16(v[2 * i], v[2 * i + 1]));
    }
    for (int i = 0; i < 4; ++i) {
      b[i] = Op<kMax>(_mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                      _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    }
    for (int i = 0; i < 2; ++i) {
      c[i] = Op<kMax>(_mm256_unpacklo_epi64(b[2 * i], b[2 * i + 1]),
                      _mm256_unpackhi_epi64(b[2 * i], b[2 * i + 1]));
    }
    return Op<kMax>(_mm256_permute2x128_si256(c[0], c[1], 0x20),
                    _mm256_permute2x128_si256(c[0], c[1], 0x31));
  }
  template <bool kMax>
  QPARAMS_AVX2_INLINE static __m256i Op(__m256i a, __m256i b) {
    return kMax ? Max(a, b) : Min(a, b);
  }
  template <typename F>
  QPARAMS_AVX2_INLINE static __m256i NonFinite(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_cmpgt_epi16(hi, _mm256_set1_epi16(F::kPositiveInfinityKey - 1)),
                           _mm256_cmpgt_epi16(_mm256_set1_epi16(F::kNegativeInfinityKey + 1), lo));
  }
  // phminposuw finds the unsigned minimum of 8 lanes in one instruction; xor with
  // 0x8000 (0x7fff) maps signed keys onto unsigned ones in (reversed) order.
  QPARAMS_AVX2_INLINE static int16_t HMin(__m256i v) {
    const __m128i m = _mm_min_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i flip = _mm_set1_epi16(static_cast<int16_t>(0x8000));
    return static_cast<int16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, flip))) ^
                                0x8000);
  }
  QPARAMS_AVX2_INLINE static int16_t HMax(__m256i v) {
    const __m128i m = _mm_max_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i flip = _mm_set1_epi16(0x7fff);
    return static_cast<int16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, flip))) ^
                                0x7fff);
  }
};

template <typename F>
QPARAMS_AVX2_INLINE __m256i LoadKeys(const uint8_t* p, int64_t i) {
  return Lanes<F>::Key(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * sizeof(typename F::Bits))));
}

// Min/max keys of n contiguous elements, combined into lo/hi. Two independent
// accumulators hide the min/max latency on long spans. Inlined into the per-row
// loop of StoreRowsAvx2, where rows may be as short as a 32-element block.
template <typename F>
QPARAMS_AVX2_INLINE void ReduceRowAvx2(const uint8_t* p, int64_t n, typename F::Key& lo,
                                       typename F::Key& hi) {
  using L = Lanes<F>;
  if (n < L::kCount) return ReduceSpanPortable<F>(p, n, lo, hi);
  __m256i lo0 = LoadKeys<F>(p, 0), hi0 = lo0, lo1 = lo0, hi1 = lo0;
  int64_t i = L::kCount;
  for (; i + 2 * L::kCount <= n; i += 2 * L::kCount) {
    const __m256i k0 = LoadKeys<F>(p, i), k1 = LoadKeys<F>(p, i + L::kCount);
    lo0 = L::Min(lo0, k0);
    hi0 = L::Max(hi0, k0);
    lo1 = L::Min(lo1, k1);
    hi1 = L::Max(hi1, k1);
  }
  for (; i + L::kCount <= n; i += L::kCount) {
    const __m256i k = LoadKeys<F>(p, i);
    lo0 = L::Min(lo0, k);
    hi0 = L::Max(hi0, k);
  }
  typename F::Key l = L::HMin(L::Min(lo0, lo1)), h = L::HMax(L::Max(hi0, hi1));
  if (i < n) ReduceSpanPortable<F>(p + i * sizeof(typename F::Bits), n - i, l, h);
  lo = l < lo ? l : lo;
  hi = h > hi ? h : hi;
}

QPARAMS_AVX2 inline bool Any(__m256i mask) { return !_mm256_testz_si256(mask, mask); }

template <typename F>
QPARAMS_AVX2 void ReduceSpanAvx2(const uint8_t* p, int64_t n, typename F::Key& lo,
                                 typename F::Key& hi) {
  ReduceRowAvx2<F>(p, n, lo, hi);
}

// Accumulators stay in registers across a batch of rows: one load and store of
// lo/hi per column vector per batch, not per row.
template <typename F>
QPARAMS_AVX2 void CombineRowsAvx2(const uint8_t* p, int64_t n, int64_t rows, typename F::Key* lo,
                                  typename F::Key* hi) {
  using L = Lanes<F>;
  constexpr int64_t kBatch = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
    const int64_t batch = rows - r0 < kBatch ? rows - r0 : kBatch;
    const uint8_t* base = p + r0 * n * sizeof(typename F::Bits);
    int64_t j = 0;
    for (; j + L::kCount <= n; j += L::kCount) {
      __m256i* lv = reinterpret_cast<__m256i*>(lo + j);
      __m256i* hv = reinterpret_cast<__m256i*>(hi + j);
      __m256i l = _mm256_loadu_si256(lv), h = _mm256_loadu_si256(hv);
      for (int64_t r = 0; r < batch; ++r) {
        const __m256i k = LoadKeys<F>(base, r * n + j);
        l = L::Min(l, k);
        h = L::Max(h, k);
      }
      _mm256_storeu_si256(lv, l);
      _mm256_storeu_si256(hv, h);
    }
    if (j < n) {
      for (int64_t r = 0; r < batch; ++r) {
        CombineRowsPortable<F>(base + (r * n + j) * sizeof(typename F::Bits), n - j, 1, lo + j,
                               hi + j);
      }
    }
  }
}

// Short rows (blocks of up to 8 vectors) spend more on the horizontal min/max than
// on the data; batches of kCount rows share one transposing reduction instead, and
// their results are decoded, checked and stored as whole vectors.
template <typename F>
QPARAMS_AVX2 bool StoreRowsAvx2(const uint8_t* p, int64_t n, int64_t r0, int64_t r1, uint8_t* lo,
                                uint8_t* hi) {
  using Bits = typename F::Bits;
  using L = Lanes<F>;
  int64_t r = r0;
  __m256i bad = _mm256_setzero_si256();
  if (n % L::kCount == 0 && n <= 8 * L::kCount) {
    for (; r + L::kCount <= r1; r += L::kCount) {
      __m256i row_min[L::kCount], row_max[L::kCount];
      for (int b = 0; b < L::kCount; ++b) {
        const uint8_t* row = p + (r + b) * n * sizeof(Bits);
        __m256i k = LoadKeys<F>(row, 0), mn = k, mx = k;
        for (int64_t i = L::kCount; i < n; i += L::kCount) {
          k = LoadKeys<F>(row, i);
          mn = L::Min(mn, k);
          mx = L::Max(mx, k);
        }
        row_min[b] = mn;
        row_max[b] = mx;
      }
      const __m256i lo_keys = L::template Transpose<false>(row_min);
      const __m256i hi_keys = L::template Transpose<true>(row_max);
      bad = _mm256_or_si256(bad, L::template NonFinite<F>(lo_keys, hi_keys));
      // The key map is its own inverse: Key() decodes too.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * sizeof(Bits)), L::Key(lo_keys));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * sizeof(Bits)), L::Key(hi_keys));
    }
  }
  bool any = Any(bad);
  for (; r < r1; ++r) {
    typename F::Key l = F::kMaxKey, h = F::kMinKey;
    ReduceRowAvx2<F>(p + r * n * sizeof(Bits), n, l, h);
    any |= StoreBlock<F>(l, h, r, lo, hi);
  }
  return any;
}

template <typename F>
Kernels<F> Avx2Kernels() {
  return {ReduceSpanAvx2<F>, CombineRowsAvx2<F>, StoreRowsAvx2<F>};
}

// ---- float32: compared as floats ----
//
// vminps/vmaxps need no key transform, and x * 0 is NaN exactly for a NaN or an
// infinite x: or-ed into an accumulator (or added, in independent chains) it flags
// non-finite values. Accumulators enter
// and leave as keys; the identity keys decode to NaNs, which vminps(acc, x) and
// vmaxps(acc, x) replace by x at once (a NaN operand yields the second one).

#define QPARAMS_AVX2_FMA __attribute__((target("avx2,fma")))
#define QPARAMS_AVX2_FMA_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

using F32 = Float32Format;
using L32 = Lanes<F32>;

QPARAMS_AVX2_FMA_INLINE __m256 KeysToFloats(__m256i k) {
  return _mm256_castsi256_ps(L32::Key(k));  // the key map is its own inverse
}

QPARAMS_AVX2_FMA_INLINE __m256 LoadFloats(const uint8_t* p, int64_t i) {
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + i);
}

QPARAMS_AVX2_FMA_INLINE bool AnyNaN(__m256 v) {
  return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0;
}

QPARAMS_AVX2_FMA_INLINE float HMinFloat(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_min_ps(m, _mm_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

QPARAMS_AVX2_FMA_INLINE float HMaxFloat(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_permute_ps(m, _MM_SHUFFLE(1, 0, 3, 2)));
  m = _mm_max_ps(m, _mm_permute_ps(m, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(m);
}

// A non-finite value makes its block's max +Inf, which the final check
// (Format::NonFinite) reports and which, unlike a NaN, later vmaxps keep.
inline constexpr int32_t kNonFiniteMaxKey = F32::kPositiveInfinityKey;

QPARAMS_AVX2_FMA_INLINE void ReduceRowFloat32(const uint8_t* p, int64_t n, int32_t& lo,
                                              int32_t& hi) {
  if (n < 8) return ReduceSpanPortable<F32>(p, n, lo, hi);
  const __m256 zero = _mm256_setzero_ps();
  __m256 mn0 = LoadFloats(p, 0), mx0 = mn0, mn1 = mn0, mx1 = mn0;
  __m256 bad0 = _mm256_fmadd_ps(mn0, zero, zero), bad1 = zero;
  int64_t i = 8;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = LoadFloats(p, i), x1 = LoadFloats(p, i + 8);
    mn0 = _mm256_min_ps(mn0, x0);
    mx0 = _mm256_max_ps(mx0, x0);
    bad0 = _mm256_fmadd_ps(x0, zero, bad0);
    mn1 = _mm256_min_ps(mn1, x1);
    mx1 = _mm256_max_ps(mx1, x1);
    bad1 = _mm256_fmadd_ps(x1, zero, bad1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 x = LoadFloats(p, i);
    mn0 = _mm256_min_ps(mn0, x);
    mx0 = _mm256_max_ps(mx0, x);
    bad0 = _mm256_fmadd_ps(x, zero, bad0);
  }
  int32_t l = F32::ToKey(FloatBits(HMinFloat(_mm256_min_ps(mn0, mn1))));
  int32_t h = F32::ToKey(FloatBits(HMaxFloat(_mm256_max_ps(mx0, mx1))));
  if (AnyNaN(_mm256_add_ps(bad0, bad1))) h = kNonFiniteMaxKey;
  if (i < n) ReduceSpanPortable<F32>(p + i * sizeof(float), n - i, l, h);
  lo = l < lo ? l : lo;
  hi = h > hi ? h : hi;
}

QPARAMS_AVX2_FMA void ReduceSpanFloat32(const uint8_t* p, int64_t n, int32_t& lo, int32_t& hi) {
  ReduceRowFloat32(p, n, lo, hi);
}

QPARAMS_AVX2_FMA void CombineRowsFloat32(const uint8_t* p, int64_t n, int64_t rows, int32_t* lo,
                                         int32_t* hi) {
  constexpr int64_t kBatch = 16;
  const __m256 zero = _mm256_setzero_ps();
  __m256 bad = zero;
  for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
    const int64_t batch = rows - r0 < kBatch ? rows - r0 : kBatch;
    const uint8_t* base = p + r0 * n * sizeof(float);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      __m256i* lv = reinterpret_cast<__m256i*>(lo + j);
      __m256i* hv = reinterpret_cast<__m256i*>(hi + j);
      __m256 l = KeysToFloats(_mm256_loadu_si256(lv)), h = KeysToFloats(_mm256_loadu_si256(hv));
      for (int64_t r = 0; r < batch; ++r) {
        const __m256 x = LoadFloats(base, r * n + j);
        l = _mm256_min_ps(l, x);
        h = _mm256_max_ps(h, x);
        bad = _mm256_or_ps(bad, _mm256_mul_ps(x, zero));
      }
      _mm256_storeu_si256(lv, L32::Key(_mm256_castps_si256(l)));
      _mm256_storeu_si256(hv, L32::Key(_mm256_castps_si256(h)));
    }
    if (j < n) {
      for (int64_t r = 0; r < batch; ++r) {
        CombineRowsPortable<F32>(base + (r * n + j) * sizeof(float), n - j, 1, lo + j, hi + j);
      }
    }
  }
  if (AnyNaN(bad)) hi[0] = kNonFiniteMaxKey;
}

// As StoreRowsAvx2: batches of 8 short rows share one transposing reduction.
QPARAMS_AVX2_FMA bool StoreRowsFloat32(const uint8_t* p, int64_t n, int64_t r0, int64_t r1,
                                       uint8_t* lo, uint8_t* hi) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 bad = zero;
  int64_t r = r0;
  if (n % 8 == 0 && n <= 64) {
    for (; r + 8 <= r1; r += 8) {
      __m256 row_min[8], row_max[8];
      for (int b = 0; b < 8; ++b) {
        const uint8_t* row = p + (r + b) * n * sizeof(float);
        __m256 x = LoadFloats(row, 0), mn = x, mx = x;
        bad = _mm256_or_ps(bad, _mm256_mul_ps(x, zero));
        for (int64_t i = 8; i < n; i += 8) {
          x = LoadFloats(row, i);
          mn = _mm256_min_ps(mn, x);
          mx = _mm256_max_ps(mx, x);
          bad = _mm256_or_ps(bad, _mm256_mul_ps(x, zero));
        }
        row_min[b] = mn;
        row_max[b] = mx;
      }
      // Lanes::Transpose on the float bits: min/max as floats instead of keys.
      __m256 a[4], c[2];
      for (int i = 0; i < 4; ++i) {
        a[i] = _mm256_min_ps(_mm256_unpacklo_ps(row_min[2 * i], row_min[2 * i + 1]),
                             _mm256_unpackhi_ps(row_min[2 * i], row_min[2 * i + 1]));
      }
      for (int i = 0; i < 2; ++i) {
        c[i] = _mm256_min_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a[2 * i]),
                                                                 _mm256_castps_pd(a[2 * i + 1]))),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a[2 * i]),
                                                                 _mm256_castps_pd(a[2 * i + 1]))));
      }
      const __m256 block_min = _mm256_min_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20),
                                             _mm256_permute2f128_ps(c[0], c[1], 0x31));
      for (int i = 0; i < 4; ++i) {
        a[i] = _mm256_max_ps(_mm256_unpacklo_ps(row_max[2 * i], row_max[2 * i + 1]),
                             _mm256_unpackhi_ps(row_max[2 * i], row_max[2 * i + 1]));
      }
      for (int i = 0; i < 2; ++i) {
        c[i] = _mm256_max_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a[2 * i]),
                                                                 _mm256_castps_pd(a[2 * i + 1]))),
                             _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a[2 * i]),
                                                                 _mm256_castps_pd(a[2 * i + 1]))));
      }
      const __m256 block_max = _mm256_max_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20),
                                             _mm256_permute2f128_ps(c[0], c[1], 0x31));
      _mm256_storeu_ps(reinterpret_cast<float*>(lo) + r, block_min);
      _mm256_storeu_ps(reinterpret_cast<float*>(hi) + r, block_max);
    }
  }
  bool any = AnyNaN(bad);
  for (; r < r1; ++r) {
    int32_t l = F32::kMaxKey, h = F32::kMinKey;
    ReduceRowFloat32(p + r * n * sizeof(float), n, l, h);
    any |= StoreBlock<F32>(l, h, r, lo, hi);
  }
  return any;
}

}  // namespace

Kernels<Float32Format> Avx2Float32Kernels() {
  return {ReduceSpanFloat32, CombineRowsFloat32, StoreRowsFloat32};
}
Kernels<Float16Format> Avx2Float16Kernels() { return Avx2Kernels<Float16Format>(); }
Kernels<BFloat16Format> Avx2BFloat16Kernels() { return Avx2Kernels<BFloat16Format>(); }

}  // namespace qparams::range_internal

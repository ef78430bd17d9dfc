// The AVX-512 inner loops of the range pass for long rows: one instruction handles
// 64 bytes, and vpternlog folds the key's mask-and-xor into one. Short rows (small
// blocks) keep the AVX2 transposing kernel. Like range_kernels_avx2.cc, functions
// carry their target instead of the file being built for it.

#include <immintrin.h>

// GCC 12 flags the deliberately undefined pass-through operand of _mm512_srai_*.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "core/range_kernels.h"

#define QPARAMS_AVX512 __attribute__((target("avx512f,avx512bw"), always_inline)) inline

namespace qparams::range_internal {
namespace {

// 512-bit vectors of a format's keys. For key(u) = u ^ ((u >> (w-1)) & mask),
// vpternlog computes a ^ (b & c) with the immediate 0x78.
template <typename F>
struct Lanes512;

template <uint32_t kExponentMask>
struct Lanes512<Format<uint32_t, int32_t, kExponentMask>> {
  static constexpr int kCount = 16;
  QPARAMS_AVX512 static __m512i Key(__m512i u) {
    return _mm512_ternarylogic_epi32(u, _mm512_srai_epi32(u, 31), _mm512_set1_epi32(0x7fffffff),
                                     0x78);
  }
  QPARAMS_AVX512 static __m512i Min(__m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
  QPARAMS_AVX512 static __m512i Max(__m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
  QPARAMS_AVX512 static int32_t HMin(__m512i v) { return _mm512_reduce_min_epi32(v); }
  QPARAMS_AVX512 static int32_t HMax(__m512i v) { return _mm512_reduce_max_epi32(v); }
};

template <uint16_t kExponentMask>
struct Lanes512<Format<uint16_t, int16_t, kExponentMask>> {
  static constexpr int kCount = 32;
  QPARAMS_AVX512 static __m512i Key(__m512i u) {
    return _mm512_ternarylogic_epi32(u, _mm512_srai_epi16(u, 15), _mm512_set1_epi16(0x7fff),
                                     0x78);
  }
  QPARAMS_AVX512 static __m512i Min(__m512i a, __m512i b) { return _mm512_min_epi16(a, b); }
  QPARAMS_AVX512 static __m512i Max(__m512i a, __m512i b) { return _mm512_max_epi16(a, b); }
  // Halve to 128 bits, then phminposuw (see range_kernels_avx2.cc).
  QPARAMS_AVX512 static int16_t HMin(__m512i v) {
    const __m256i h = _mm256_min_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    const __m128i m = _mm_min_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i flip = _mm_set1_epi16(static_cast<int16_t>(0x8000));
    return static_cast<int16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, flip))) ^
                                0x8000);
  }
  QPARAMS_AVX512 static int16_t HMax(__m512i v) {
    const __m256i h = _mm256_max_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    const __m128i m = _mm_max_epi16(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    const __m128i flip = _mm_set1_epi16(0x7fff);
    return static_cast<int16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, flip))) ^
                                0x7fff);
  }
};

template <typename F>
QPARAMS_AVX512 __m512i LoadKeys(const uint8_t* p, int64_t i) {
  return Lanes512<F>::Key(_mm512_loadu_si512(p + i * sizeof(typename F::Bits)));
}

// As ReduceRowAvx2, four accumulators deep.
template <typename F>
QPARAMS_AVX512 void ReduceRow(const uint8_t* p, int64_t n, typename F::Key& lo,
                              typename F::Key& hi) {
  using L = Lanes512<F>;
  if (n < L::kCount) return ReduceSpanPortable<F>(p, n, lo, hi);
  __m512i lo0 = LoadKeys<F>(p, 0), hi0 = lo0, lo1 = lo0, hi1 = lo0;
  int64_t i = L::kCount;
  for (; i + 2 * L::kCount <= n; i += 2 * L::kCount) {
    const __m512i k0 = LoadKeys<F>(p, i), k1 = LoadKeys<F>(p, i + L::kCount);
    lo0 = L::Min(lo0, k0);
    hi0 = L::Max(hi0, k0);
    lo1 = L::Min(lo1, k1);
    hi1 = L::Max(hi1, k1);
  }
  for (; i + L::kCount <= n; i += L::kCount) {
    const __m512i k = LoadKeys<F>(p, i);
    lo0 = L::Min(lo0, k);
    hi0 = L::Max(hi0, k);
  }
  typename F::Key l = L::HMin(L::Min(lo0, lo1)), h = L::HMax(L::Max(hi0, hi1));
  if (i < n) ReduceSpanPortable<F>(p + i * sizeof(typename F::Bits), n - i, l, h);
  lo = l < lo ? l : lo;
  hi = h > hi ? h : hi;
}

template <typename F>
__attribute__((target("avx512f,avx512bw"))) void ReduceSpanAvx512(const uint8_t* p, int64_t n,
                                                                  typename F::Key& lo,
                                                                  typename F::Key& hi) {
  ReduceRow<F>(p, n, lo, hi);
}

// As CombineRowsAvx2: accumulators stay in registers across a batch of rows.
template <typename F>
__attribute__((target("avx512f,avx512bw"))) void CombineRowsAvx512(const uint8_t* p, int64_t n,
                                                                   int64_t rows,
                                                                   typename F::Key* lo,
                                                                   typename F::Key* hi) {
  using L = Lanes512<F>;
  constexpr int64_t kBatch = 8;
  for (int64_t r0 = 0; r0 < rows; r0 += kBatch) {
    const int64_t batch = rows - r0 < kBatch ? rows - r0 : kBatch;
    const uint8_t* base = p + r0 * n * sizeof(typename F::Bits);
    int64_t j = 0;
    for (; j + L::kCount <= n; j += L::kCount) {
      __m512i l = _mm512_loadu_si512(lo + j), h = _mm512_loadu_si512(hi + j);
      for (int64_t r = 0; r < batch; ++r) {
        const __m512i k = LoadKeys<F>(base, r * n + j);
        l = L::Min(l, k);
        h = L::Max(h, k);
      }
      _mm512_storeu_si512(lo + j, l);
      _mm512_storeu_si512(hi + j, h);
    }
    if (j < n) {
      for (int64_t r = 0; r < batch; ++r) {
        CombineRowsPortable<F>(base + (r * n + j) * sizeof(typename F::Bits), n - j, 1, lo + j,
                               hi + j);
      }
    }
  }
}

template <typename F>
__attribute__((target("avx512f,avx512bw"))) bool StoreRowsAvx512(const uint8_t* p, int64_t n,
                                                                 int64_t r0, int64_t r1,
                                                                 uint8_t* lo, uint8_t* hi) {
  using Bits = typename F::Bits;
  if (n <= 4 * Lanes512<F>::kCount) {
    // Short rows: the AVX2 kernel's transposing reduction does better.
    if constexpr (std::is_same_v<F, Float32Format>) {
      return Avx2Float32Kernels().store_rows(p, n, r0, r1, lo, hi);
    } else if constexpr (std::is_same_v<F, Float16Format>) {
      return Avx2Float16Kernels().store_rows(p, n, r0, r1, lo, hi);
    } else {
      return Avx2BFloat16Kernels().store_rows(p, n, r0, r1, lo, hi);
    }
  }
  bool bad = false;
  for (int64_t r = r0; r < r1; ++r) {
    typename F::Key l = F::kMaxKey, h = F::kMinKey;
    ReduceRow<F>(p + r * n * sizeof(Bits), n, l, h);
    bad |= StoreBlock<F>(l, h, r, lo, hi);
  }
  return bad;
}

template <typename F>
Kernels<F> Avx512Kernels() {
  return {ReduceSpanAvx512<F>, CombineRowsAvx512<F>, StoreRowsAvx512<F>};
}

}  // namespace

Kernels<Float32Format> Avx512Float32Kernels() { return Avx512Kernels<Float32Format>(); }
Kernels<Float16Format> Avx512Float16Kernels() { return Avx512Kernels<Float16Format>(); }
Kernels<BFloat16Format> Avx512BFloat16Kernels() { return Avx512Kernels<BFloat16Format>(); }

}  // namespace qparams::range_internal

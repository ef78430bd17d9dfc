// The AVX2 inner loops of the range pass. Each function carries target("avx2")
// rather than the file being built with -mavx2, so that the inline and template code
// it shares with the portable path is never compiled for AVX2 (which would break the
// one-definition rule on CPUs without it). BestKernels() calls in only where the CPU
// has AVX2.
//
// The loops work on the raw bits, not on keys: a signed min, a signed max and an
// unsigned max of the bit patterns (three instructions, no key transform) determine
// the float min and max of a set. Sign-magnitude order means:
//   min = the largest unsigned pattern if any has the sign bit set (the most negative
//         value), else the smallest signed one;
//   max = the largest signed pattern if any is non-negative, else the smallest signed
//         one (the negative value nearest zero).
// NaN and Inf patterns sort beyond every finite one, so a set holds one exactly when
// its signed max reaches +Inf's pattern or its unsigned max reaches -Inf's.

#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/range_kernels.h"

#define QPARAMS_AVX2 __attribute__((target("avx2")))
#define QPARAMS_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline
#define QPARAMS_AVX2_LAMBDA __attribute__((target("avx2"), always_inline))

namespace qparams::range_internal {
namespace {

// The three running extremes of a set of patterns, one per lane.
struct Extremes {
  __m256i smin, smax, umax;
};

enum class Op { kMinSigned, kMaxSigned, kMaxUnsigned };

// 256-bit vectors of a format's bit patterns.
template <typename F>
struct Lanes;

template <uint32_t kExponentMask>
struct Lanes<Format<uint32_t, int32_t, kExponentMask>> {
  static constexpr int kCount = 8;
  template <Op kOp>
  QPARAMS_AVX2_INLINE static __m256i Apply(__m256i a, __m256i b) {
    if constexpr (kOp == Op::kMinSigned) return _mm256_min_epi32(a, b);
    if constexpr (kOp == Op::kMaxSigned) return _mm256_max_epi32(a, b);
    return _mm256_max_epu32(a, b);
  }
  QPARAMS_AVX2_INLINE static __m256i Splat(uint32_t v) {
    return _mm256_set1_epi32(static_cast<int32_t>(v));
  }
  QPARAMS_AVX2_INLINE static __m256i SignMask(__m256i v) { return _mm256_srai_epi32(v, 31); }
  QPARAMS_AVX2_INLINE static __m256i Equal(__m256i a, __m256i b) {
    return _mm256_cmpeq_epi32(a, b);
  }
  QPARAMS_AVX2_INLINE static __m256i Greater(__m256i a, __m256i b) {
    return _mm256_cmpgt_epi32(a, b);
  }
  template <Op kOp>
  QPARAMS_AVX2_INLINE static uint32_t Horizontal(__m256i v) {
    __m128i m = Apply128<kOp>(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = Apply128<kOp>(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
    m = Apply128<kOp>(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
  }
  template <Op kOp>
  QPARAMS_AVX2_INLINE static __m128i Apply128(__m128i a, __m128i b) {
    if constexpr (kOp == Op::kMinSigned) return _mm_min_epi32(a, b);
    if constexpr (kOp == Op::kMaxSigned) return _mm_max_epi32(a, b);
    return _mm_max_epu32(a, b);
  }
  // Levels of the transposing tree (Pair, below): log2(kCount).
  static constexpr int kLevels = 3;
};

template <uint16_t kExponentMask>
struct Lanes<Format<uint16_t, int16_t, kExponentMask>> {
  static constexpr int kCount = 16;
  template <Op kOp>
  QPARAMS_AVX2_INLINE static __m256i Apply(__m256i a, __m256i b) {
    if constexpr (kOp == Op::kMinSigned) return _mm256_min_epi16(a, b);
    if constexpr (kOp == Op::kMaxSigned) return _mm256_max_epi16(a, b);
    return _mm256_max_epu16(a, b);
  }
  QPARAMS_AVX2_INLINE static __m256i Splat(uint16_t v) {
    return _mm256_set1_epi16(static_cast<int16_t>(v));
  }
  QPARAMS_AVX2_INLINE static __m256i SignMask(__m256i v) { return _mm256_srai_epi16(v, 15); }
  QPARAMS_AVX2_INLINE static __m256i Equal(__m256i a, __m256i b) {
    return _mm256_cmpeq_epi16(a, b);
  }
  QPARAMS_AVX2_INLINE static __m256i Greater(__m256i a, __m256i b) {
    return _mm256_cmpgt_epi16(a, b);
  }
  // phminposuw finds the unsigned minimum of 8 lanes in one instruction; xor maps
  // each order onto it.
  template <Op kOp>
  QPARAMS_AVX2_INLINE static uint16_t Horizontal(__m256i v) {
    const __m128i m = Apply128<kOp>(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const uint16_t flip =
        kOp == Op::kMinSigned ? 0x8000 : (kOp == Op::kMaxSigned ? 0x7fff : 0xffff);
    const __m128i f = _mm_set1_epi16(static_cast<int16_t>(flip));
    return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, f))) ^ flip);
  }
  template <Op kOp>
  QPARAMS_AVX2_INLINE static __m128i Apply128(__m128i a, __m128i b) {
    if constexpr (kOp == Op::kMinSigned) return _mm_min_epi16(a, b);
    if constexpr (kOp == Op::kMaxSigned) return _mm_max_epi16(a, b);
    return _mm_max_epu16(a, b);
  }
  static constexpr int kLevels = 4;
};

// The even and the odd groups of kBits bits of a and b, each interleaved a, b, a, b
// within the 128-bit halves (for 128, the halves themselves).
struct Interleaved {
  __m256i even, odd;
};

template <int kBits>
QPARAMS_AVX2_INLINE Interleaved Interleave(__m256i a, __m256i b) {
  static_assert(kBits == 16 || kBits == 32 || kBits == 64 || kBits == 128);
  if constexpr (kBits == 16) return {_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b)};
  if constexpr (kBits == 32) return {_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b)};
  if constexpr (kBits == 64) return {_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b)};
  return {_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)};
}

// Level kLevel of the transposing tree (Fold, below): kOp over the neighbouring
// groups of 2^(kLevel-1) lanes of a and of b, the results of a and b interleaved.
// Lanes<F>::kLevels levels leave one lane per input row.
template <typename F, int kLevel, Op kOp>
QPARAMS_AVX2_INLINE __m256i Pair(__m256i a, __m256i b) {
  const Interleaved groups = Interleave<(F::kWidth << (kLevel - 1))>(a, b);
  return Lanes<F>::template Apply<kOp>(groups.even, groups.odd);
}

template <typename F>
QPARAMS_AVX2_INLINE __m256i Load(const uint8_t* p, int64_t i) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * sizeof(typename F::Bits)));
}

// The key map on whole vectors (its own inverse: it also decodes keys).
template <typename F>
QPARAMS_AVX2_INLINE __m256i Key(__m256i v) {
  using L = Lanes<F>;
  return _mm256_xor_si256(v, _mm256_and_si256(L::SignMask(v), L::Splat(F::kMaxKey)));
}

template <typename F>
QPARAMS_AVX2_INLINE Extremes Start(__m256i v) {
  return {v, v, v};
}

// Which of the three extremes a loop keeps, as a set of bits. A set known to hold both
// a negative and a non-negative value needs no signed minimum: its min is the largest
// unsigned pattern and its max the largest signed one, whatever else it holds. A set
// known to hold no negative value needs no unsigned maximum, which equals its signed
// maximum.
enum Keep : int {
  kSignedMin = 1,
  kSignedMax = 2,
  kUnsignedMax = 4,
  kAll = kSignedMin | kSignedMax | kUnsignedMax,
  kMixed = kSignedMax | kUnsignedMax,
  kNonNegative = kSignedMin | kSignedMax,
};

template <typename F, int kKeep = kAll>
QPARAMS_AVX2_INLINE void Add(Extremes& e, __m256i v) {
  using L = Lanes<F>;
  if constexpr (kKeep & kSignedMin) e.smin = L::template Apply<Op::kMinSigned>(e.smin, v);
  if constexpr (kKeep & kSignedMax) e.smax = L::template Apply<Op::kMaxSigned>(e.smax, v);
  if constexpr (kKeep & kUnsignedMax) e.umax = L::template Apply<Op::kMaxUnsigned>(e.umax, v);
}

template <typename F>
QPARAMS_AVX2_INLINE void Merge(Extremes& e, const Extremes& o) {
  using L = Lanes<F>;
  e.smin = L::template Apply<Op::kMinSigned>(e.smin, o.smin);
  e.smax = L::template Apply<Op::kMaxSigned>(e.smax, o.smax);
  e.umax = L::template Apply<Op::kMaxUnsigned>(e.umax, o.umax);
}

// The patterns of each lane's float min and max (see the file comment).
template <typename F>
QPARAMS_AVX2_INLINE void Decode(const Extremes& e, __m256i& lo, __m256i& hi) {
  using L = Lanes<F>;
  lo = _mm256_blendv_epi8(e.smin, e.umax, L::SignMask(e.umax));
  hi = _mm256_blendv_epi8(e.smax, e.smin, L::SignMask(e.smax));
}

// The scalar Decode, as keys.
template <typename F>
QPARAMS_AVX2_INLINE void DecodeKeys(typename F::Bits smin, typename F::Bits smax,
                                    typename F::Bits umax, typename F::Key& lo,
                                    typename F::Key& hi) {
  constexpr typename F::Bits kSign = typename F::Bits(1) << (F::kWidth - 1);
  lo = F::ToKey((umax & kSign) ? umax : smin);
  hi = F::ToKey((smax & kSign) ? smin : smax);
}

// Lanes holding a NaN or an infinity: signed max at or beyond +Inf's pattern, or
// unsigned max at or beyond -Inf's.
template <typename F>
QPARAMS_AVX2_INLINE __m256i NonFinite(const Extremes& e) {
  using L = Lanes<F>;
  constexpr typename F::Bits kInf = F::FromKey(F::kPositiveInfinityKey);
  constexpr typename F::Bits kNegInf = F::FromKey(F::kNegativeInfinityKey);
  const __m256i neg_inf = L::Splat(kNegInf);
  return _mm256_or_si256(L::Greater(e.smax, L::Splat(kInf - 1)),
                         L::Equal(L::template Apply<Op::kMaxUnsigned>(e.umax, neg_inf), e.umax));
}

QPARAMS_AVX2_INLINE bool Any(__m256i mask) { return !_mm256_testz_si256(mask, mask); }

// How far ahead the loops prefetch where the hardware prefetcher falls short:
// ReduceRow run row after row (each row's loop exit is mispredicted, which empties
// the pipeline of loads; bfloat16 per_channel(0), 8 KiB rows: 65% -> 85% of the read
// bandwidth on one core), and CombineRows' 8 side-by-side row streams (a plain sum
// of 8 rows read side by side: 86% -> 93% on one core). Long contiguous spans need
// none, and far NTA prefetches on them measured slower too.
inline constexpr int64_t kPrefetchAhead = 1024;
// Rows longer than this stream on like one span, which the prefetches only slow.
inline constexpr size_t kPrefetchRowBytes = size_t{64} << 10;

// Whether a and b together hold a negative value (an unsigned max with the sign bit)
// and a non-negative one (a signed max without it).
template <typename F>
QPARAMS_AVX2_INLINE bool BothSigns(const Extremes& a, const Extremes& b) {
  using L = Lanes<F>;
  const __m256i negative = L::SignMask(_mm256_or_si256(a.umax, b.umax));
  const __m256i all_smax_negative = L::SignMask(_mm256_and_si256(a.smax, b.smax));
  return Any(negative) && _mm256_movemask_epi8(all_smax_negative) != -1;
}

// Spans of at least this many bytes check for both signs every kSignCheckSteps steps
// of 4 vectors, and go on with two vector ops per load instead of three once they
// are seen (typical weights and activations show both in their first vectors). On
// two cores streaming from memory near their peak the third op is what a plain sum
// does not pay: a 128 MiB bfloat16 per_tensor pass went from 86-89% to 91-97% of the
// read-and-sum bandwidth. Shorter spans, rows of per_channel(0) say, keep one loop:
// a second loop exit per row cost them more than the op saved.
inline constexpr size_t kSignCheckMinBytes = size_t{64} << 10;
inline constexpr int64_t kSignCheckSteps = 16;

// Min/max keys of n contiguous elements, combined into lo/hi. Two sets of extremes
// hide the instruction latency on long spans.
template <typename F, bool kPrefetch = false>
QPARAMS_AVX2_INLINE void ReduceRow(const uint8_t* p, int64_t n, typename F::Key& lo,
                                   typename F::Key& hi) {
  using L = Lanes<F>;
  if (n < L::kCount) return ReduceSpanPortable<F>(p, n, lo, hi);
  Extremes e0 = Start<F>(Load<F>(p, 0)), e1 = e0;
  constexpr int64_t kStep = 4 * L::kCount;
  auto prefetch = [=](int64_t i) QPARAMS_AVX2_LAMBDA {
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i * sizeof(typename F::Bits)) + kPrefetchAhead,
                   _MM_HINT_T0);
    }
  };
  // 4 vectors from element i on, keeping kMixed or all three extremes.
  auto step = [&](int64_t i, auto mixed) QPARAMS_AVX2_LAMBDA {
    auto add = [p](Extremes& e, int64_t at) QPARAMS_AVX2_LAMBDA {
      Add<F, decltype(mixed)::value ? kMixed : kAll>(e, Load<F>(p, at));
    };
    prefetch(i);
    prefetch(i + 2 * L::kCount);
    add(e0, i);
    add(e1, i + L::kCount);
    add(e0, i + 2 * L::kCount);
    add(e1, i + 3 * L::kCount);
  };
  int64_t i = L::kCount;
  const int64_t steps_end = i + (n - i) / kStep * kStep;
  if (n * sizeof(typename F::Bits) >= kSignCheckMinBytes) {
    bool mixed = false;
    while (i < steps_end && !mixed) {
      const int64_t stop = std::min(steps_end, i + kSignCheckSteps * kStep);
      for (; i < stop; i += kStep) step(i, std::false_type());
      mixed = BothSigns<F>(e0, e1);
    }
    if (mixed) {
      for (; i < steps_end; i += kStep) step(i, std::true_type());
    }
  }
  for (; i < steps_end; i += kStep) step(i, std::false_type());
  for (; i + 2 * L::kCount <= n; i += 2 * L::kCount) {
    prefetch(i);
    Add<F>(e0, Load<F>(p, i));
    Add<F>(e1, Load<F>(p, i + L::kCount));
  }
  for (; i + L::kCount <= n; i += L::kCount) Add<F>(e0, Load<F>(p, i));
  Merge<F>(e0, e1);
  typename F::Key l, h;
  DecodeKeys<F>(L::template Horizontal<Op::kMinSigned>(e0.smin),
                L::template Horizontal<Op::kMaxSigned>(e0.smax),
                L::template Horizontal<Op::kMaxUnsigned>(e0.umax), l, h);
  if (i < n) ReduceSpanPortable<F>(p + i * sizeof(typename F::Bits), n - i, l, h);
  lo = l < lo ? l : lo;
  hi = h > hi ? h : hi;
}

template <typename F>
QPARAMS_AVX2 void ReduceSpanAvx2(const uint8_t* p, int64_t n, typename F::Key& lo,
                                 typename F::Key& hi) {
  ReduceRow<F>(p, n, lo, hi);
}

// Rows side by side in batches of 8, one cache line of each per step. (Rows whose
// length is a multiple of 4 KiB put their lines in one L1 set: 16 of them evicted each
// other before use, 8 fit.) Between batches each column vector's extremes wait in a
// scratch array as the three patterns, so a batch costs three loads and stores per
// vector rather than a round trip through keys. (float32 per_channel(-1) of 16384 x
// 4096: 76-88% -> 100% of the read-and-sum bandwidth; 2x the speed from cache.)
inline constexpr int64_t kCombineBatch = 8;

template <typename F>
QPARAMS_AVX2 void CombineRowsAvx2(const uint8_t* p, int64_t n, int64_t rows, typename F::Key* lo,
                                  typename F::Key* hi) {
  using Bits = typename F::Bits;
  using L = Lanes<F>;
  constexpr int64_t kCount = L::kCount;
  if (n < kCount) return CombineRowsPortable<F>(p, n, rows, lo, hi);
  // Column vectors ("slots") at 0, kCount, ...; a partial last one ends at n,
  // overlapping its neighbour (min and max do not mind seeing a column twice).
  const int64_t full = n / kCount;
  const int64_t slots = full + (n % kCount != 0);
  auto column = [full, n](int64_t s) { return s < full ? s * kCount : n - kCount; };
  std::vector<Bits> scratch(3 * kCount * slots);
  auto get = [&scratch](int64_t s) QPARAMS_AVX2_LAMBDA {
    const __m256i* q = reinterpret_cast<const __m256i*>(scratch.data()) + 3 * s;
    return Extremes{_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1), _mm256_loadu_si256(q + 2)};
  };
  auto put = [&scratch](int64_t s, const Extremes& e) QPARAMS_AVX2_LAMBDA {
    __m256i* q = reinterpret_cast<__m256i*>(scratch.data()) + 3 * s;
    _mm256_storeu_si256(q, e.smin);
    _mm256_storeu_si256(q + 1, e.smax);
    _mm256_storeu_si256(q + 2, e.umax);
  };

  // Keys decode to patterns with the same map; an empty lane (identity keys, lo > hi)
  // starts from the identities of the three extremes.
  const __m256i no_smin = L::Splat(static_cast<Bits>(F::kMaxKey));
  const __m256i no_smax = L::Splat(static_cast<Bits>(F::kMinKey));
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t j = column(s);
    const __m256i lo_key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + j));
    const __m256i hi_key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + j));
    const __m256i empty = L::Greater(lo_key, hi_key);
    Extremes e = Start<F>(Key<F>(lo_key));
    Add<F>(e, Key<F>(hi_key));
    put(s, {_mm256_blendv_epi8(e.smin, no_smin, empty), _mm256_blendv_epi8(e.smax, no_smax, empty),
            _mm256_andnot_si256(empty, e.umax)});
  }

  const int64_t row_bytes = n * sizeof(Bits);
  for (int64_t r0 = 0; r0 < rows; r0 += kCombineBatch) {
    const uint8_t* base = p + r0 * row_bytes;
    int64_t s = 0;
    if (rows - r0 >= kCombineBatch) {
      for (; s + 2 <= full; s += 2) {
        const int64_t offset = s * kCount * sizeof(Bits);
        const uint8_t* q = base + offset;
        Extremes e0 = get(s), e1 = get(s + 1);
        for (int64_t r = 0; r < kCombineBatch; ++r) {
          Add<F>(e0, Load<F>(q + r * row_bytes, 0));
          Add<F>(e1, Load<F>(q + r * row_bytes, kCount));
        }
        // Ahead along this batch's walk, which past the row ends goes on in the next
        // batch's rows.
        const uint8_t* ahead = q + kPrefetchAhead;
        if (offset + kPrefetchAhead >= row_bytes) ahead += (kCombineBatch - 1) * row_bytes;
        for (int64_t r = 0; r < kCombineBatch; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(ahead + r * row_bytes), _MM_HINT_T0);
        }
        put(s, e0);
        put(s + 1, e1);
      }
    }
    const int64_t batch = std::min(rows - r0, kCombineBatch);
    for (; s < slots; ++s) {
      Extremes e = get(s);
      for (int64_t r = 0; r < batch; ++r) Add<F>(e, Load<F>(base + r * row_bytes, column(s)));
      put(s, e);
    }
  }

  for (int64_t s = 0; s < slots; ++s) {
    const int64_t j = column(s);
    __m256i new_lo, new_hi;
    Decode<F>(get(s), new_lo, new_hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + j), Key<F>(new_lo));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + j), Key<F>(new_hi));
  }
}

// Calls reading at least this much write their block minima and maxima past the
// cache: the data streaming in would evict them before anyone reads them, and a
// normal store first reads its line in. (float32 per_block 32, whose output is 1/16
// of the input: 73% -> 85% of the read bandwidth on one core.)
inline constexpr int64_t kStreamInputMinBytes = int64_t{4} << 20;

QPARAMS_AVX2_INLINE bool Aligned16(const uint8_t* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Stores 32 bytes to p, 16-byte aligned, with non-temporal stores.
QPARAMS_AVX2_INLINE void Stream(uint8_t* p, __m256i v) {
  _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(v));
  _mm_stream_si128(reinterpret_cast<__m128i*>(p) + 1, _mm256_extracti128_si256(v, 1));
}

// The extremes of 2^kLevel consecutive rows of n elements (a multiple of kCount) from
// `row` on, folded through the levels of a transposing tree: at level kLevels, lane b
// holds those of row b. Depth first, so that few vectors are live at a time (reducing
// all rows before transposing spilled them to the stack: bfloat16 per_block 32 ran at
// half the speed from cache). The extremes kKeep drops are zero, which Decode and
// NonFinite read right for the rows that fit kMixed or kNonNegative.
template <typename F, int kKeep, int kLevel>
QPARAMS_AVX2_INLINE Extremes Fold(const uint8_t* row, int64_t n) {
  using L = Lanes<F>;
  Extremes e = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  if constexpr (kLevel == 0) {
    const __m256i v = Load<F>(row, 0);
    if constexpr (kKeep & kSignedMin) e.smin = v;
    if constexpr (kKeep & kSignedMax) e.smax = v;
    if constexpr (kKeep & kUnsignedMax) e.umax = v;
    for (int64_t i = L::kCount; i < n; i += L::kCount) Add<F, kKeep>(e, Load<F>(row, i));
  } else {
    const int64_t half_bytes = (int64_t{1} << (kLevel - 1)) * n * sizeof(typename F::Bits);
    const Extremes a = Fold<F, kKeep, kLevel - 1>(row, n);
    const Extremes b = Fold<F, kKeep, kLevel - 1>(row + half_bytes, n);
    if constexpr (kKeep & kSignedMin) e.smin = Pair<F, kLevel, Op::kMinSigned>(a.smin, b.smin);
    if constexpr (kKeep & kSignedMax) e.smax = Pair<F, kLevel, Op::kMaxSigned>(a.smax, b.smax);
    if constexpr (kKeep & kUnsignedMax) e.umax = Pair<F, kLevel, Op::kMaxUnsigned>(a.umax, b.umax);
  }
  return e;
}

// The signed minimum or the unsigned maximum for the batches whose rows the two
// extremes kept did not fit, out of line: they are rare, and inlining them as well
// cost the common path its registers.
template <typename F, int kKeep>
__attribute__((target("avx2"), noinline)) __m256i FoldRare(const uint8_t* row, int64_t n) {
  static_assert(kKeep == kSignedMin || kKeep == kUnsignedMax);
  const Extremes e = Fold<F, kKeep, Lanes<F>::kLevels>(row, n);
  return kKeep == kSignedMin ? e.smin : e.umax;
}

// Whether every lane's row fits kKeep (kMixed or kNonNegative), given those extremes.
template <typename F, int kKeep>
QPARAMS_AVX2_INLINE bool Fits(const Extremes& e) {
  using L = Lanes<F>;
  static_assert(kKeep == kMixed || kKeep == kNonNegative);
  const __m256i sign = L::Splat(typename F::Bits(1) << (F::kWidth - 1));
  if constexpr (kKeep == kMixed) {
    // A negative (the unsigned max's sign bit) and a non-negative value (no sign bit
    // on the signed max) in every lane.
    return _mm256_testc_si256(_mm256_andnot_si256(e.smax, e.umax), sign);
  }
  return _mm256_testz_si256(e.smin, sign);
}

// The fewest extremes enough for every lane of e, which holds all three: kMixed,
// kNonNegative, or kAll (a lane whose values are all negative needs all three).
template <typename F>
QPARAMS_AVX2_INLINE int Needed(const Extremes& e) {
  if (Fits<F, kMixed>(e)) return kMixed;
  if (Fits<F, kNonNegative>(e)) return kNonNegative;
  return kAll;
}

// Short rows (blocks of up to 8 vectors) spend more on the horizontal reductions than
// on the data; batches of kCount rows share transposing reductions instead, and their
// results are decoded, checked and stored as whole vectors. The tree's shuffles
// outweigh the loads, so a batch folds only the extremes that were enough for the
// batch before (Needed), and where two are not enough folds the third in a second
// pass over the batch, from L1. Per_block 32 from cache on one core: bfloat16 66 ->
// 89 GB/s, float32 84 -> 107; all-negative blocks, which need all three, as before;
// data whose sign kind flips at every batch, the worst case, pays the second pass and
// a mispredicted branch each time (float32: 66 GB/s).
template <typename F>
QPARAMS_AVX2 bool StoreRowsAvx2(const uint8_t* p, int64_t n, int64_t r0, int64_t r1, uint8_t* lo,
                                uint8_t* hi) {
  using Bits = typename F::Bits;
  using L = Lanes<F>;
  bool any = false;
  auto store_row = [&](int64_t r) QPARAMS_AVX2_LAMBDA {
    typename F::Key l = F::kMaxKey, h = F::kMinKey;
    if (n * sizeof(Bits) <= kPrefetchRowBytes) {
      ReduceRow<F, /*kPrefetch=*/true>(p + r * n * sizeof(Bits), n, l, h);
    } else {
      ReduceRow<F>(p + r * n * sizeof(Bits), n, l, h);
    }
    any |= StoreBlock<F>(l, h, r, lo, hi);
  };
  int64_t r = r0;
  if (n % L::kCount == 0 && n <= 8 * L::kCount) {
    bool stream = false;
    if ((r1 - r0) * n * sizeof(Bits) >= kStreamInputMinBytes) {
      // Single rows up to a 16-byte boundary of the output.
      constexpr int64_t kAlignRows = 16 / sizeof(Bits);
      for (; r < r1 && r % kAlignRows != 0; ++r) store_row(r);
      stream = Aligned16(lo + r * sizeof(Bits)) && Aligned16(hi + r * sizeof(Bits));
    }
    __m256i bad = _mm256_setzero_si256();
    auto store = [&](int64_t r, const Extremes& blocks) QPARAMS_AVX2_LAMBDA {
      bad = _mm256_or_si256(bad, NonFinite<F>(blocks));
      __m256i block_lo, block_hi;
      Decode<F>(blocks, block_lo, block_hi);
      if (stream) {
        Stream(lo + r * sizeof(Bits), block_lo);
        Stream(hi + r * sizeof(Bits), block_hi);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * sizeof(Bits)), block_lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * sizeof(Bits)), block_hi);
      }
    };
    int keep = kMixed;  // the extremes enough for the batch before
    // The batch of rows from r on through the pair kPair, completed with the third
    // extreme where the pair is not enough.
    auto store_through_pair = [&](int64_t r, auto pair) QPARAMS_AVX2_LAMBDA {
      constexpr int kPair = decltype(pair)::value;
      const uint8_t* rows = p + r * n * sizeof(Bits);
      Extremes blocks = Fold<F, kPair, L::kLevels>(rows, n);
      if (!Fits<F, kPair>(blocks)) {
        if constexpr (kPair == kMixed) {
          blocks.smin = FoldRare<F, kSignedMin>(rows, n);
        } else {
          blocks.umax = FoldRare<F, kUnsignedMax>(rows, n);
        }
        keep = Needed<F>(blocks);
      }
      store(r, blocks);
    };
    for (; r + L::kCount <= r1; r += L::kCount) {
      if (keep == kMixed) {
        store_through_pair(r, std::integral_constant<int, kMixed>());
      } else if (keep == kNonNegative) {
        store_through_pair(r, std::integral_constant<int, kNonNegative>());
      } else {
        const Extremes blocks = Fold<F, kAll, L::kLevels>(p + r * n * sizeof(Bits), n);
        keep = Needed<F>(blocks);
        store(r, blocks);
      }
    }
    any = Any(bad) || any;
    // Orders the non-temporal stores before whatever the caller does next.
    if (stream) _mm_sfence();
  }
  for (; r < r1; ++r) store_row(r);
  return any;
}

template <typename F>
Kernels<F> Avx2Kernels() {
  return {ReduceSpanAvx2<F>, CombineRowsAvx2<F>, StoreRowsAvx2<F>};
}

}  // namespace

Kernels<Float32Format> Avx2Float32Kernels() { return Avx2Kernels<Float32Format>(); }
Kernels<Float16Format> Avx2Float16Kernels() { return Avx2Kernels<Float16Format>(); }
Kernels<BFloat16Format> Avx2BFloat16Kernels() { return Avx2Kernels<BFloat16Format>(); }

}  // namespace qparams::range_internal

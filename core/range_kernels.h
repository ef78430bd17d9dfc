// Internal to range.cc: the inner loops of the range pass, per binary format, with a
// portable version and an AVX2 one (range_kernels_avx2.cc) chosen at run time.
//
// Min and max are taken on an order-preserving signed key (sign-magnitude folded
// into two's complement), so one integer code serves all four dtypes without float
// compares. NaNs and infinities have the most extreme keys, so a block holds a
// non-finite value exactly when its min key is at or below that of -Inf or its max
// key at or above that of +Inf: the check costs nothing in the loops.

#ifndef QPARAMS_CORE_RANGE_KERNELS_H_
#define QPARAMS_CORE_RANGE_KERNELS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace qparams::range_internal {

template <typename BitsT, typename KeyT, BitsT kExponentMask>
struct Format {
  using Bits = BitsT;
  using Key = KeyT;
  static constexpr int kWidth = 8 * sizeof(Bits);
  static constexpr Key kMaxKey = std::numeric_limits<Key>::max();
  static constexpr Key kMinKey = std::numeric_limits<Key>::min();

  static constexpr Key ToKey(Bits u) {
    const Key s = static_cast<Key>(u);
    return static_cast<Key>(s ^ ((s >> (kWidth - 1)) & kMaxKey));
  }
  // The key map is its own inverse.
  static constexpr Bits FromKey(Key k) { return static_cast<Bits>(ToKey(static_cast<Bits>(k))); }

  static constexpr Key kPositiveInfinityKey = ToKey(kExponentMask);
  static constexpr Key kNegativeInfinityKey = ToKey(kExponentMask | (Bits{1} << (kWidth - 1)));
  // A block whose min and max keys are lo and hi holds a NaN or an infinity.
  static constexpr bool NonFinite(Key lo, Key hi) {
    return lo <= kNegativeInfinityKey || hi >= kPositiveInfinityKey;
  }
  static bool NonFinite(Bits u) { return (u & kExponentMask) == kExponentMask; }

  static Bits Load(const uint8_t* p, int64_t i) {
    Bits u;
    std::memcpy(&u, p + i * sizeof u, sizeof u);
    return u;
  }
};

using Float32Format = Format<uint32_t, int32_t, 0x7f800000u>;
using Float16Format = Format<uint16_t, int16_t, 0x7c00u>;
using BFloat16Format = Format<uint16_t, int16_t, 0x7f80u>;
using Float64Format = Format<uint64_t, int64_t, 0x7ff0000000000000ull>;

// The three inner loops, working on keys.
template <typename F>
struct Kernels {
  using Key = typename F::Key;
  // lo/hi := min/max of their keys and those of n contiguous elements.
  void (*reduce_span)(const uint8_t* p, int64_t n, Key& lo, Key& hi);
  // lo[j]/hi[j] := min/max of their keys and those of element j of each of `rows`
  // consecutive rows of n elements.
  void (*combine_rows)(const uint8_t* p, int64_t n, int64_t rows, Key* lo, Key* hi);
  // Rows [r0, r1) of n elements, each one block: its min/max bits into lo/hi[r].
  // Returns whether a block holds a non-finite value.
  bool (*store_rows)(const uint8_t* p, int64_t n, int64_t r0, int64_t r1, uint8_t* lo, uint8_t* hi);
};

template <typename F>
void ReduceSpanPortable(const uint8_t* __restrict p, int64_t n, typename F::Key& lo,
                        typename F::Key& hi) {
  using Key = typename F::Key;
  Key l = lo, h = hi;
  for (int64_t i = 0; i < n; ++i) {
    const Key k = F::ToKey(F::Load(p, i));
    l = k < l ? k : l;
    h = k > h ? k : h;
  }
  lo = l;
  hi = h;
}

template <typename F>
void CombineRowsPortable(const uint8_t* __restrict p, int64_t n, int64_t rows,
                         typename F::Key* __restrict lo, typename F::Key* __restrict hi) {
  using Key = typename F::Key;
  for (int64_t r = 0; r < rows; ++r, p += n * sizeof(typename F::Bits)) {
    for (int64_t j = 0; j < n; ++j) {
      const Key k = F::ToKey(F::Load(p, j));
      lo[j] = k < lo[j] ? k : lo[j];
      hi[j] = k > hi[j] ? k : hi[j];
    }
  }
}

// Stores block r's min and max (given as keys) as bits; returns whether the block
// holds a non-finite value.
template <typename F>
inline bool StoreBlock(typename F::Key lo_key, typename F::Key hi_key, int64_t r, uint8_t* lo,
                       uint8_t* hi) {
  const typename F::Bits lb = F::FromKey(lo_key), hb = F::FromKey(hi_key);
  std::memcpy(lo + r * sizeof lb, &lb, sizeof lb);
  std::memcpy(hi + r * sizeof hb, &hb, sizeof hb);
  return F::NonFinite(lo_key, hi_key);
}

template <typename F>
bool StoreRowsPortable(const uint8_t* p, int64_t n, int64_t r0, int64_t r1, uint8_t* lo,
                       uint8_t* hi) {
  bool bad = false;
  for (int64_t r = r0; r < r1; ++r) {
    typename F::Key l = F::kMaxKey, h = F::kMinKey;
    ReduceSpanPortable<F>(p + r * n * sizeof(typename F::Bits), n, l, h);
    bad |= StoreBlock<F>(l, h, r, lo, hi);
  }
  return bad;
}

template <typename F>
Kernels<F> PortableKernels() {
  return {ReduceSpanPortable<F>, CombineRowsPortable<F>, StoreRowsPortable<F>};
}

// The AVX2 kernels (range_kernels_avx2.cc), for the 16- and 32-bit formats. (AVX-512
// versions were measured slower on the target machines: 68% of the read bandwidth
// against AVX2's 95%.)
Kernels<Float32Format> Avx2Float32Kernels();
Kernels<Float16Format> Avx2Float16Kernels();
Kernels<BFloat16Format> Avx2BFloat16Kernels();

// The instruction sets the loops exist for, narrowest first.
enum class KernelLevel { kPortable = 0, kAvx2 = 1 };

// The widest level this CPU runs.
inline KernelLevel DetectedKernelLevel() {
  return __builtin_cpu_supports("avx2") ? KernelLevel::kAvx2 : KernelLevel::kPortable;
}

// A cap on the level BestKernels picks, so that tests run every version of the loops
// on one machine.
inline std::atomic<KernelLevel> kernel_level_cap{KernelLevel::kAvx2};

template <typename F>
Kernels<F> KernelsAt(KernelLevel level) {
  if (level == KernelLevel::kAvx2) {
    if constexpr (std::is_same_v<F, Float32Format>) return Avx2Float32Kernels();
    if constexpr (std::is_same_v<F, Float16Format>) return Avx2Float16Kernels();
    if constexpr (std::is_same_v<F, BFloat16Format>) return Avx2BFloat16Kernels();
  }
  return PortableKernels<F>();
}

// The widest kernels this CPU runs, within kernel_level_cap.
template <typename F>
const Kernels<F>& BestKernels() {
  static const Kernels<F> levels[] = {KernelsAt<F>(KernelLevel::kPortable),
                                      KernelsAt<F>(KernelLevel::kAvx2)};
  static const KernelLevel detected = DetectedKernelLevel();
  return levels[static_cast<int>(std::min(detected, kernel_level_cap.load()))];
}

}  // namespace qparams::range_internal

#endif  // QPARAMS_CORE_RANGE_KERNELS_H_

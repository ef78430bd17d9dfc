// The bad requests of Observe, ObserveStream and ObserveBatch on sessions in each
// state: names, idempotency keys, tensors, ranges, the batch limit.

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "proto/convert.h"
#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> ObservationRows() {
  Table table;

  // ---- Observe: names, observation, tensors on the sessions ----
  table.Observe("name with a space", ObserveTensorReq("hard/a b", Good()), kInvalid, "name");
  table.Observe("unknown session", ObserveTensorReq("hard/missing", Good()), kNotFound,
                "hard/missing");
  table.Observe("observation unset", Named<v1::ObserveRequest>(kMovingAvg), kInvalid,
                "observation");
  // Idempotency keys (docs/retries.md): refused before the session is looked at.
  const std::string long_id(65, 'k');
  const std::vector<std::tuple<std::string, std::string, uint64_t, std::string>> keys = {
      {"client_id with a space", "a b", 1, "client_id"},
      {"client_id with a slash", "a/b", 1, "client_id"},
      {"client_id of 65 characters", long_id, 1, "client_id"},
      {"client_id without a sequence", "client-1", 0, "sequence must be >= 1"},
      {"sequence without a client_id", "", 5, "without a client_id"}};
  for (const auto& [what, id, sequence, field] : keys) {
    table.Stream(what, WithKey(ObserveTensorReq(kStatic, Good()), id, sequence), kInvalid, field);
    table.Observe(what, WithKey(ObserveTensorReq(kStatic, Good()), id, sequence), kInvalid, field);
  }
  // The uninitialized static session, per_channel(axis=1).
  table.Observe("static: rank-1 tensor for per_channel axis 1",
                ObserveTensorReq(kStatic, F32({3}, {1, 2, 3})), kInvalid,
                "granularity.per_channel.axis");
  table.Observe("static: NaN in float32 (first forward)",
                ObserveTensorReq(kStatic, F32({2, 2}, {1, 2, kNaN, 4})), kInvalid, "tensor.data");
  table.Observe("static: zero-size [3, 0] (first forward)",
                ObserveTensorReq(kStatic, RawTensor(v1::FLOAT32, {3, 0}, "")), kInvalid,
                "tensor.shape");
  table.Observe("static: range min f32, max f16 (dtypes differ)",
                ObserveRangeReq(kStatic, {2, 3}, F32({1, 3}, {-1, -1, -1}), F16({1, 3}, {1, 1, 1})),
                kInvalid, "range.max.dtype");
  // The initialized moving_average session: bf16, per_channel(axis=0), N = [2, 1].
  table.Observe(
      "ma: data one byte short",
      ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {2, 3}, std::string(11, '\0'))),
      kInvalid, "tensor.data");
  table.Observe(
      "ma: data two bytes long",
      ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {2, 3}, std::string(14, '\0'))),
      kInvalid, "tensor.data");
  table.Observe("ma: zero-size [0, 3]",
                ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {0, 3}, "")), kInvalid,
                "tensor.shape");
  table.Observe("ma: NaN in bfloat16",
                ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {1, 2, 3, 4, 5, kNaN})), kInvalid,
                "tensor.data");
  table.Observe("ma: +Inf in bfloat16",
                ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {kInf, 2, 3, 4, 5, 6})), kInvalid,
                "tensor.data");
  table.Observe("ma: float32 after bfloat16 (dtype change)", ObserveTensorReq(kMovingAvg, Good()),
                kPrecondition, "dtype");
  table.Observe("ma: float16 after bfloat16 (dtype change)",
                ObserveTensorReq(kMovingAvg, F16({2, 3}, {1, 2, 3, 4, 5, 6})), kPrecondition,
                "dtype");
  table.Observe("ma: [3, 3] gives N [3, 1] after [2, 1] (block count change)",
                ObserveTensorReq(kMovingAvg, Bf16({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})),
                kPrecondition, "shape");
  table.Observe("ma: rank 1 [6] gives N [6] after [2, 1]",
                ObserveTensorReq(kMovingAvg, Bf16({6}, {1, 2, 3, 4, 5, 6})), kPrecondition,
                "shape");
  table.Observe("ma range: min of the wrong shape [1, 2]",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({1, 2}, {-1, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.min.shape");
  table.Observe("ma range: max of the wrong shape [2]",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), Bf16({2}, {1, 1})),
                kInvalid, "range.max.shape");
  table.Observe("ma range: min bf16, max f32 (dtypes differ)",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), F32({2, 1}, {1, 1})),
                kInvalid, "range.max.dtype");
  table.Observe("ma range: min and max f32 on a bf16 session",
                ObserveRangeReq(kMovingAvg, {2, 3}, F32({2, 1}, {-1, -1}), F32({2, 1}, {1, 1})),
                kPrecondition, "dtype");
  table.Observe("ma range: min > max in block 1",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, 2}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.min[1]");
  table.Observe("ma range: NaN in min",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {kNaN, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.min.data");
  table.Observe(
      "ma range: -Inf in max",
      ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, -kInf})),
      kInvalid, "range.max.data");
  table.Observe("ma range: empty input_shape",
                ObserveRangeReq(kMovingAvg, {}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.input_shape");
  table.Observe("ma range: negative input_shape",
                ObserveRangeReq(kMovingAvg, {2, -3}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.input_shape");
  table.Observe("ma range: zero in input_shape",
                ObserveRangeReq(kMovingAvg, {2, 0}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.input_shape");
  table.Observe("ma range: input_shape overflows int64",
                ObserveRangeReq(kMovingAvg, {2, std::numeric_limits<int64_t>::max()},
                                Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
                kInvalid, "range.input_shape");
  table.Observe(
      "ma range: input_shape above max_tensor_elements",
      ObserveRangeReq(kMovingAvg, {2, kMaxElements}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
      kExhausted, "range.input_shape");
  table.Observe("ma range: min unset",
                ObserveRangeReq(kMovingAvg, {2, 3}, std::nullopt, Bf16({2, 1}, {1, 1})), kInvalid,
                "range.min");
  table.Observe("ma range: max data one byte short",
                ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}),
                                RawTensor(v1::BFLOAT16, {2, 1}, std::string(3, '\0'))),
                kInvalid, "range.max.data");
  table.Observe("ma range: input_shape [4, 3] changes N to [4, 1]",
                ObserveRangeReq(kMovingAvg, {4, 3}, Bf16({4, 1}, {-1, -1, -1, -1}),
                                Bf16({4, 1}, {1, 1, 1, 1})),
                kPrecondition, "shape");
  // The export-mode session: cached forwards, but tensors must be well formed.
  table.Observe(
      "export: tensor dtype unset",
      ObserveTensorReq(kExport, RawTensor(v1::DTYPE_UNSPECIFIED, {4}, std::string(16, '\0'))),
      kInvalid, "tensor.dtype");
  table.Observe("export: negative dim", ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {-4}, "")),
                kInvalid, "tensor.shape");
  table.Observe("export: rank 0", ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {}, "")),
                kInvalid, "tensor.shape");
  table.Observe("export: data too long",
                ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {4}, std::string(20, '\0'))),
                kInvalid, "tensor.data");
  table.Observe("export: well-formed tensor above max_tensor_elements",
                ObserveTensorReq(kExport, RawTensor(v1::FLOAT16, {kMaxElements + 2},
                                                    std::string(2 * (kMaxElements + 2), '\0'))),
                kExhausted, "tensor.shape");
  table.Observe("export: range with an empty input_shape",
                ObserveRangeReq(kExport, {}, F32({1}, {-1}), F32({1}, {1})), kInvalid,
                "range.input_shape");
  table.Observe("export: range whose max dtype is unset",
                ObserveRangeReq(kExport, {4}, F32({1}, {-1}),
                                RawTensor(v1::DTYPE_UNSPECIFIED, {1}, std::string(4, '\0'))),
                kInvalid, "range.max.dtype");
  // The per_block session: static, block_size (-1, 2), f16 [2, 4], N = [1, 2].
  table.Observe("block: dim 1 (3) not divisible by block size 2",
                ObserveTensorReq(kBlock, F16({2, 3}, {1, 2, 3, 4, 5, 6})), kInvalid,
                "granularity.per_block.block_size");
  table.Observe("block: rank 1 for a 2-entry block_size",
                ObserveTensorReq(kBlock, F16({4}, {1, 2, 3, 4})), kInvalid,
                "granularity.per_block.block_size");
  table.Observe("block: [2, 8] gives N [1, 4] after [1, 2] (block count change)",
                ObserveTensorReq(kBlock, F16({2, 8}, std::vector<double>(16, 1.0))), kPrecondition,
                "shape");
  table.Observe("block: bfloat16 after float16 (dtype change)",
                ObserveTensorReq(kBlock, Bf16({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})), kPrecondition,
                "dtype");
  table.Observe("block range: input_shape [2, 5] not divisible",
                ObserveRangeReq(kBlock, {2, 5}, F16({1, 2}, {-1, -1}), F16({1, 2}, {1, 1})),
                kInvalid, "granularity.per_block.block_size");

  // ---- ObserveStream: the per-response status ----
  table.Stream("stream: name empty", ObserveTensorReq("", Good()), kInvalid, "name");
  table.Stream("stream: unknown session", ObserveTensorReq("hard/missing", Good()), kNotFound,
               "hard/missing");
  table.Stream("stream: observation unset", Named<v1::ObserveRequest>(kStatic), kInvalid,
               "observation");
  table.Stream("stream: -Inf in bfloat16 on the ma session",
               ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {1, 2, 3, -kInf, 5, 6})), kInvalid,
               "tensor.data");
  table.Stream("stream: float32 on the f16 block session",
               ObserveTensorReq(kBlock, F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})), kPrecondition,
               "dtype");
  table.Stream("stream: short data on the export session",
               ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {4}, std::string(15, '\0'))),
               kInvalid, "tensor.data");
  table.Stream("stream: range min > max on the static session",
               ObserveRangeReq(kStatic, {2, 3}, F32({1, 3}, {0, 2, 0}), F32({1, 3}, {1, 1, 1})),
               kInvalid, "range.min[1]");

  // ---- ObserveBatch: the call's own status ----
  {
    v1::ObserveBatchRequest batch;
    for (int i = 0; i <= wire::kMaxBatchObservations; ++i) {
      *batch.add_observations() = ObserveTensorReq(kStatic, Good());
    }
    table.Add("batch: one observation over the limit, all of them good", Method::kObserveBatch,
              std::move(batch), kExhausted, "observations");
  }
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request

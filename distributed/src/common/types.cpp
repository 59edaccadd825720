// Element type names, parsing and the fp16 conversion (bf16's is inline in the header).
#include "cortado/dist/types.h"

#include "common/names.h"
#include "cortado/dist/error.h"

namespace cortado::dist {

namespace {

constexpr internal::Spelling<ErrorKind> kErrorKindNames[] = {
    {ErrorKind::kInvalidArgument, "invalid argument"},
    {ErrorKind::kConfig, "configuration"},
    {ErrorKind::kTimeout, "timeout"},
    {ErrorKind::kPeerFailure, "peer failure"},
    {ErrorKind::kRejected, "rejected"},
    {ErrorKind::kProtocol, "protocol"},
    {ErrorKind::kSystem, "system"},
    {ErrorKind::kInternal, "internal"}};
constexpr internal::Spelling<DataType> kDataTypeNames[] = {
    {DataType::kF32, "f32"},     {DataType::kF16, "f16"},     {DataType::kBF16, "bf16"},
    {DataType::kF64, "f64"},     {DataType::kF32, "float32"}, {DataType::kF32, "float"},
    {DataType::kF16, "float16"}, {DataType::kF16, "half"},    {DataType::kBF16, "bfloat16"},
    {DataType::kF64, "float64"}, {DataType::kF64, "double"}};
constexpr internal::Spelling<ReduceOp> kReduceOpNames[] = {{ReduceOp::kSum, "sum"},
                                                           {ReduceOp::kAvg, "avg"},
                                                           {ReduceOp::kMax, "max"},
                                                           {ReduceOp::kAvg, "average"},
                                                           {ReduceOp::kAvg, "mean"}};

}  // namespace

const char* ErrorKindName(ErrorKind kind) { return internal::NameOf(kErrorKindNames, kind); }

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kF32:
      return 4;
    case DataType::kF16:
    case DataType::kBF16:
      return 2;
    case DataType::kF64:
      return 8;
  }
  return 4;
}

const char* DataTypeName(DataType type) { return internal::NameOf(kDataTypeNames, type); }

const char* ReduceOpName(ReduceOp op) { return internal::NameOf(kReduceOpNames, op); }

DataType ParseDataType(const std::string& name) {
  if (auto type = internal::FindName(kDataTypeNames, name)) return *type;
  Fail(ErrorKind::kInvalidArgument, "unknown element type '", name,
       "' (known: ", internal::KnownNames(kDataTypeNames), ")");
}

ReduceOp ParseReduceOp(const std::string& name) {
  if (auto op = internal::FindName(kReduceOpNames, name)) return *op;
  Fail(ErrorKind::kInvalidArgument, "unknown reduction '", name,
       "' (known: ", internal::KnownNames(kReduceOpNames), ")");
}

}  // namespace cortado::dist

#include "capture/finite_ranges.h"

#include <cfloat>
#include <optional>

#include "capture/op_arguments.h"
#include "torchrr/kernels/finite.h"

namespace torchrr::recorder {
namespace {

std::optional<kernels::FloatKind> KindOf(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Half: return kernels::FloatKind::kFloat16;
    case c10::ScalarType::BFloat16: return kernels::FloatKind::kBFloat16;
    case c10::ScalarType::Float: return kernels::FloatKind::kFloat32;
    case c10::ScalarType::Double: return kernels::FloatKind::kFloat64;
    default: return std::nullopt;
  }
}

}  // namespace

format::ValueRange ScanTensorRange(const at::Tensor& tensor) {
  format::ValueRange range;
  try {
    if (!tensor.defined()) return range;
    const c10::TensorImpl& impl = *tensor.unsafeGetTensorImpl();
    const std::optional<kernels::FloatKind> kind = KindOf(impl.dtype().toScalarType());
    if (!kind || !impl.has_storage() || impl.layout() != c10::kStrided) return range;
    // Python subclasses (FakeTensor under torch.compile, wrapper subclasses) hold no bytes of
    // their own here.
    if (impl.is_python_dispatch()) return range;
    const c10::Storage& storage = impl.unsafe_storage();
    if (storage.device().type() != c10::DeviceType::CPU) return range;
    const auto sizes = impl.sizes();
    const auto strides = impl.strides();
    const uint64_t item = impl.itemsize();
    int64_t last = impl.storage_offset();  // In elements.
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] == 0) {
        range.flags = format::ValueRange::kChecked;
        return range;
      }
      if (strides[d] < 0) return range;
      last += (sizes[d] - 1) * strides[d];
    }
    const auto* base = static_cast<const unsigned char*>(storage.data());
    if (base == nullptr || static_cast<uint64_t>(last + 1) * item > storage.nbytes()) return range;
    const kernels::FiniteScan scan =
        kernels::ScanFiniteHost(base + impl.storage_offset() * item, *kind, sizes.data(),
                                strides.data(), static_cast<int>(sizes.size()));
    range.flags = format::ValueRange::kChecked;
    if (scan.flags & kernels::kHasNan) range.flags |= format::ValueRange::kNan;
    if (scan.flags & kernels::kHasPosInf) range.flags |= format::ValueRange::kPosInf;
    if (scan.flags & kernels::kHasNegInf) range.flags |= format::ValueRange::kNegInf;
    range.max_abs = scan.max_abs > FLT_MAX ? FLT_MAX : static_cast<float>(scan.max_abs);
  } catch (const std::exception&) {
    return format::ValueRange{};  // Custom sizes, or an impl that refuses: not checked.
  }
  return range;
}

void FiniteRanges::ScanInputs(c10::ArrayRef<const c10::IValue> inputs, format::OpRecord& op,
                              std::vector<InputSpan>& spans) {
  if (!enabled_ || op.inputs.empty()) return;
  spans.assign(op.inputs.size(), InputSpan{});
  // Which inputs are new, under the lock; then the scans, outside it.
  size_t i = 0;
  bool any = false;
  ForEachInputTensor(inputs, [&](const at::Tensor& t) {
    // op.inputs has the defined ones (RecordInputs).
    if (!t.defined() || i >= op.inputs.size()) return;
    const format::TensorUse& use = op.inputs[i++];
    if (!KindOf(t.scalar_type())) return;
    const c10::TensorImpl& impl = *t.unsafeGetTensorImpl();
    if (impl.has_storage() && impl.layout() == c10::kStrided && !impl.is_python_dispatch()) {
      try {
        if (impl.is_contiguous()) {
          spans[i - 1] = InputSpan{impl.unsafe_storage().unsafeGetStorageImpl(),
                                   impl.storage_offset(), impl.numel(), impl.dtype()};
        }
      } catch (const std::exception&) {
        // Custom sizes: no view takes its range.
      }
    }
    const uint64_t key = Key(use.tensor, use.version_before);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (known_.count(key) != 0) return;
    }
    if (op.input_ranges.empty()) op.input_ranges.resize(op.inputs.size());
    const format::ValueRange range = ScanTensorRange(t);
    op.input_ranges[i - 1] = range;
    any = true;
    std::lock_guard<std::mutex> lock(mu_);
    known_.emplace(key, range);
  });
  if (!any) op.input_ranges.clear();
}

std::optional<format::ValueRange> FiniteRanges::ViewRange(const at::Tensor& output,
                                                          const std::vector<InputSpan>& spans,
                                                          const format::OpRecord& op) {
  const c10::TensorImpl& out = *output.unsafeGetTensorImpl();
  if (!out.has_storage() || out.layout() != c10::kStrided || out.is_python_dispatch()) {
    return std::nullopt;
  }
  const c10::StorageImpl* storage = out.unsafe_storage().unsafeGetStorageImpl();
  int64_t first = out.storage_offset(), last = first;
  const auto sizes = out.sizes();
  const auto strides = out.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0 || strides[d] < 0) return std::nullopt;
    last += (sizes[d] - 1) * strides[d];
  }
  for (size_t i = 0; i < spans.size() && i < op.inputs.size(); ++i) {
    const InputSpan& in = spans[i];
    const format::TensorUse& use = op.inputs[i];
    // A view into an input the op did not write, its elements within the input's span.
    if (in.storage != storage || in.dtype != out.dtype() ||
        use.version_after != use.version_before || first < in.first ||
        last >= in.first + in.numel) {
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = known_.find(Key(use.tensor, use.version_before));
    if (it != known_.end() && it->second.checked() && it->second.finite()) return it->second;
  }
  return std::nullopt;
}

void FiniteRanges::ScanOutputs(std::string_view op_name, const std::vector<OpOutput>& outputs,
                               const std::vector<InputSpan>& spans, format::OpRecord& op) {
  op.output_ranges.clear();
  if (!enabled_ || format::HasUnwrittenOutputs(op_name)) return;
  bool any = false;
  for (const OpOutput& output : outputs) {
    std::optional<format::ValueRange> view;
    try {
      if (!spans.empty()) view = ViewRange(*output.tensor, spans, op);
    } catch (const std::exception&) {
      view.reset();  // Custom sizes: scanned below, which says so.
    }
    op.output_ranges.push_back(view ? *view : ScanTensorRange(*output.tensor));
    any = any || op.output_ranges.back().checked();
  }
  if (!any) op.output_ranges.clear();
}

void FiniteRanges::NoteOutputs(const format::OpRecord& op) {
  if (op.scope == format::OpScope::kBackwardFunction) {
    after_backward_.store(true, std::memory_order_relaxed);
  }
  if (op.output_ranges.size() != op.outputs.size()) return;
  std::lock_guard<std::mutex> lock(mu_);
  // Bounded: a step of a large model makes millions of tensors; forgetting costs only rescans.
  if (known_.size() > (size_t{1} << 22)) known_.clear();
  for (size_t i = 0; i < op.outputs.size(); ++i) {
    if (op.output_ranges[i].checked()) {
      known_[Key(op.outputs[i].tensor, op.outputs[i].version_after)] = op.output_ranges[i];
    }
  }
}

void FiniteRanges::ForgetKnown() {
  std::lock_guard<std::mutex> lock(mu_);
  known_.clear();
}

}  // namespace torchrr::recorder

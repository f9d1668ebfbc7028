#include "capture/op_filter.h"

#include <cstring>
#include <new>
#include <string_view>

#include <ATen/core/function_schema.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "internals/torch_internals.h"

namespace torchrr::recorder {
namespace {

// Whether a type may hold a tensor (Tensor, Tensor?, Tensor[], a tuple of them, Any).
bool MayHoldTensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType || type->kind() == c10::TypeKind::AnyType) {
    return true;
  }
  for (const c10::TypePtr& inner : type->containedTypes()) {
    if (MayHoldTensor(inner)) return true;
  }
  return false;
}

// What an ATen op's schema says: whether the op writes any of its arguments (its alias
// annotations: in-place ops, out= overloads) and whether it returns a tensor. Cached per thread by
// the name pointer, which points into the op's registered schema: looked up once per op. An op
// named by a string (C++'s RECORD_FUNCTION), whose name is a copy that can sit anywhere, has no
// schema: it counts as writing and returning tensors, and is not cached.
const ThreadState::SchemaFacts& SchemaFactsOf(const at::RecordFunction& fn, ThreadState& ts) {
  static const ThreadState::SchemaFacts kUnknown;
  const c10::FunctionSchema* schema = SchemaOf(fn);
  if (schema == nullptr) return kUnknown;
  const char* name = schema->name().c_str();
  auto it = ts.schema_facts.find(name);
  if (it != ts.schema_facts.end() && it->second.text == name) return it->second;
  ThreadState::SchemaFacts facts;
  facts.writes = schema->is_mutable();
  facts.returns_tensor = false;
  for (const c10::Argument& ret : schema->returns()) {
    facts.returns_tensor |= MayHoldTensor(ret.type());
  }
  try {
    ThreadState::SchemaFacts& entry = ts.schema_facts[name];
    entry = std::move(facts);
    entry.text = name;
    return entry;
  } catch (const std::bad_alloc&) {
    return kUnknown;  // Not cached (looked up again next time), and the op is recorded.
  }
}

}  // namespace

bool FoldedIntoTheOpAround(const at::RecordFunction& fn, ThreadState& ts) {
  if (fn.scope() != at::RecordScope::FUNCTION || ts.op_scopes.empty()) return false;
  // The ops a Python Function's backward calls are its code: what they read is how the replayer
  // knows which of its ctx's tensors backward used.
  if (ts.runs_function_code.back()) return false;
  const format::OpScope around = ts.op_scopes.back();
  if (around != format::OpScope::kFunction && around != format::OpScope::kBackwardFunction) {
    return false;
  }
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::ADInplaceOrView)) return true;
  const ThreadState::SchemaFacts& facts = SchemaFactsOf(fn, ts);
  if (facts.writes) return false;
  return !facts.returns_tensor || (ts.backward_depth > 0 && !at::GradMode::is_enabled());
}

bool IsEngineWrapper(const at::RecordFunction& fn, format::OpScope scope, int64_t sequence_nr) {
  static constexpr std::string_view kPrefix = "autograd::engine::evaluate_function: ";
  return scope == format::OpScope::kFunction && sequence_nr < 0 &&
         std::strncmp(fn.name(), kPrefix.data(), kPrefix.size()) == 0;
}

bool IsCompiledRegion(const char* name) {
  static constexpr std::string_view kPrefix = "Torch-Compiled Region";
  return std::strncmp(name, kPrefix.data(), kPrefix.size()) == 0;
}

format::OpScope ScopeOf(at::RecordScope scope) {
  switch (scope) {
    case at::RecordScope::FUNCTION: return format::OpScope::kFunction;
    case at::RecordScope::BACKWARD_FUNCTION: return format::OpScope::kBackwardFunction;
    case at::RecordScope::USER_SCOPE: return format::OpScope::kUserScope;
    default: return format::OpScope::kOther;
  }
}

}  // namespace torchrr::recorder

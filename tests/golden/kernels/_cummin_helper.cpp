// aten::_cummin_helper  (native_functions.yaml:8)
void _cummin_helper(c10::DispatchKeySet ks, const at::Tensor & self, at::Tensor & values, at::Tensor & indices, int64_t dim) {
  const auto values_before = torchgen_patch::version_of(values);
  const auto indices_before = torchgen_patch::version_of(indices);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::_ops::_cummin_helper::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, values, indices, dim);
  }
  torchgen_patch::bump_if_unchanged(values, values_before);
  torchgen_patch::bump_if_unchanged(indices, indices_before);
}

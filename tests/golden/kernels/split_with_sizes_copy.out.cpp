// aten::split_with_sizes_copy.out  (native_functions.yaml:46)
void split_with_sizes_copy_out(c10::DispatchKeySet ks, const at::Tensor & self, c10::SymIntArrayRef split_sizes, int64_t dim, at::TensorList out) {
  torchgen_patch::refuse_requires_grad("split_with_sizes_copy", self, out);
  const auto out_before = torchgen_patch::version_of(out);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::_ops::split_with_sizes_copy_out::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, split_sizes, dim, out);
  }
  torchgen_patch::bump_if_unchanged(out, out_before);
}

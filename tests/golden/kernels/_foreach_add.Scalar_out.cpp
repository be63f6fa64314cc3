// aten::_foreach_add.Scalar_out  (native_functions.yaml:22)
void _foreach_add_Scalar_out(c10::DispatchKeySet ks, at::TensorList self, const at::Scalar & scalar, at::TensorList out) {
  torchgen_patch::refuse_requires_grad("_foreach_add", self, out);
  const auto out_before = torchgen_patch::version_of(out);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::_ops::_foreach_add_Scalar_out::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, scalar, out);
  }
  torchgen_patch::bump_if_unchanged(out, out_before);
}

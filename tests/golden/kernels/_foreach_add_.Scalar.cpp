// aten::_foreach_add_.Scalar  (native_functions.yaml:22)
void _foreach_add__Scalar(c10::DispatchKeySet ks, at::TensorList self, const at::Scalar & scalar) {
  const auto self_before = torchgen_patch::version_of(self);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::_ops::_foreach_add__Scalar::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, scalar);
  }
  torchgen_patch::bump_if_unchanged(self, self_before);
}

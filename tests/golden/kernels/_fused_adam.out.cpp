// aten::_fused_adam.out  (native_functions.yaml:31)
void _fused_adam_out(c10::DispatchKeySet ks, at::TensorList self, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList state_steps, double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize, const ::std::optional<at::Tensor> & grad_scale, const ::std::optional<at::Tensor> & found_inf, at::TensorList out) {
  torchgen_patch::refuse_requires_grad("_fused_adam", self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, grad_scale, found_inf, out);
  const auto grads_before = torchgen_patch::version_of(grads);
  const auto exp_avgs_before = torchgen_patch::version_of(exp_avgs);
  const auto exp_avg_sqs_before = torchgen_patch::version_of(exp_avg_sqs);
  const auto max_exp_avg_sqs_before = torchgen_patch::version_of(max_exp_avg_sqs);
  const auto out_before = torchgen_patch::version_of(out);
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::_ops::_fused_adam_out::redispatch(ks & c10::after_ADInplaceOrView_keyset, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf, out);
  }
  torchgen_patch::bump_if_unchanged(grads, grads_before);
  torchgen_patch::bump_if_unchanged(exp_avgs, exp_avgs_before);
  torchgen_patch::bump_if_unchanged(exp_avg_sqs, exp_avg_sqs_before);
  torchgen_patch::bump_if_unchanged(max_exp_avg_sqs, max_exp_avg_sqs_before);
  torchgen_patch::bump_if_unchanged(out, out_before);
}

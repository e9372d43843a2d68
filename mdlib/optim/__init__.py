r"""``mdlib.optim``: l_p mirror descent as a ``torch.optim`` optimizer, with torch's conventions, laid out as
``torch.optim`` is (``torch/optim/sgd.py`` holds ``SGD`` and ``sgd``): ``mirror_descent`` holds the optimizer
``LpMirrorDescent`` and its update ``lp_mirror_descent``; the private modules beside it one job each.

Its update is one function, ``lp_mirror_descent`` (as torch's ``adam()`` is Adam's), which every route of
``LpMirrorDescent.step`` calls: each param group's step is the guard's edit check (``mdlib.optim._guard``),
``lp_mirror_descent`` on the group's parameters, gradients, duals and momentum buffers, and the guard's
acceptance pending the finiteness check; p = 2 and the step traced by ``torch.compile`` call it too.
It runs one of three implementations of the update, named as torch names its own (in
``mdlib.optim._steps`` and ``mdlib.optim._compiled``):

- single-tensor (``_single_tensor_lpmirrordescent``): a loop over the parameters, in-place torch
  operations (the default on CPU);
- multi-tensor (``_multi_tensor_lpmirrordescent``, ``foreach=True``): torch's ``torch._foreach_*``
  kernels, one launch per operation for all tensors of a device and dtype (the default on CUDA). On a
  CPU, where torch's foreach kernels are a loop over the tensors, it runs the single-tensor loop for
  those tensors: the same update with fewer passes (``python -m mdlib bench optimizer``);
- fused (``_fused_lpmirrordescent``, ``fused=True``): the whole update of a tensor, finiteness check
  included, as one expression compiled by ``torch.compile`` (opt-in; if compiling fails, a one-time
  warning and the other implementations).

Conventions (those of torch's optimizers, and where this one differs):

- ``lr``: a number or a 1-element tensor (as ``torch.optim.Adam`` accepts), >= 0, default 1e-3 (as
  ``torch.optim.SGD``). It is validated at construction and in ``add_param_group``, never at
  ``step()``: a scheduler may take it to 0 (``LambdaLR`` warmup, ``LinearLR(end_factor=0)``,
  ``CosineAnnealingLR`` at T_max). A step with a non-finite lr is refused like any step that would
  make a parameter non-finite. A tensor lr is read on the host by the eager implementations (as SGD
  does) and passed to the fused kernel as an argument.
- ``maximize``, ``foreach`` and ``fused`` are param-group entries (``__setstate__`` back-fills them for
  older checkpoints). ``load_state_dict`` keeps this optimizer's
  ``foreach``/``fused``: they say how this process runs the step, so a state saved with one
  implementation loads into another. ``lazy_check`` is an attribute for the same reason.
- SGD's options (``momentum``, ``dampening``, ``weight_decay``, ``nesterov``), validated as SGD validates
  them, act on the gradient as in ``torch.optim.SGD`` and their result on the dual: mirror descent on the
  loss plus weight_decay/2 ||w||_2^2, with heavy-ball or Nesterov momentum in the dual space. The momentum
  buffer is ``state[param]["momentum_buffer"]`` (saved, restored by a refused step).
- p = 2 (without normalization) is ``torch.optim.SGD`` bit for bit with every option, in each
  implementation (single-tensor, foreach; fused is torch's fused SGD); it keeps no state but SGD's
  momentum buffer.
- Complex parameters step as their ``torch.view_as_real`` (torch's convention; the dual is real). A
  sparse gradient (``nn.Embedding(sparse=True)``) updates only the entries it holds: a zero gradient
  leaves the dual, so the other rows keep their value exactly and the inverse map runs on the touched
  rows only (p = 2: as SGD; p != 2: without momentum, weight decay, normalize or fused, which would
  make the step dense, and refused there).
- A param-group key is refused when it would be silently ignored: a misspelt option (``momentun``),
  another torch optimizer's option (``betas``) or an attribute of this one (``lazy_check``); other keys
  (metadata such as ``name``) are kept with a warning; torch's own (``initial_lr``, ``max_lr``, ...)
  silently. ``differentiable=True`` is refused (a step is checked on the host and undone in place).
- The dual variable u = m(w) is optimizer state (``state[param]["dual"]``), so the float round trip
  w -> m(w) -> m^-1 is not repeated every step (float32 weights would drift ~1e-4 relative per 1000
  steps at p = 1.75). Low-precision parameters (fp16/bf16) keep u in float32, also through
  ``state_dict``/``load_state_dict`` (torch would cast it to the parameter's dtype).
- Parameters changed outside the optimizer are respected, also through ``.data`` (``p.data.clamp_``,
  ``torch.nn.utils.vector_to_parameters``), which torch's version counter does not see: every step
  first verifies, bit for bit, that each parameter is still what the optimizer last wrote (the copy an
  immediately checked step keeps in its spare buffer, else m^-1(u) by the same implementation) and
  re-derives u = m(w) for the entries that are not. Without edits, nothing changes bit for bit. It
  reads the parameter and a copy and writes the copy: four passes over memory beside the step's four.
  ``python -m mdlib bench optimizer`` (2026-12-03, a 2-core x86_64 CPU, torch 2.14.1, 10M float32
  parameters, p = 1.1, 1.75, 3): the default step 0.74-1.02x AdamW(foreach)'s time, 0.47-0.74x
  unchecked; fused 2.3x AdamW(fused)'s, 1.04-1.12x unchecked. ``check_edits=False``
  (an attribute) skips it: the same steps bit for bit, faster, but an edit made outside the optimizer
  is then overwritten from the dual at the next step unless :meth:`LpMirrorDescent.resync` is called
  after it. Keep the default unless the training loop never touches the parameters.
- A refused step changes nothing. The new dual is written into a spare buffer (u and the spare swap
  roles once the step is accepted: u plus one spare, the memory of Adam's two moments) and the new
  parameter in place, with a per-tensor flag of whether it is finite. A non-finite gradient or an
  inverse map that overflows clears a flag; the step is then undone, parameters rebuilt from the
  untouched dual by the same computation that made them (bit for bit; parameters that had no dual
  yet, or were edited outside the optimizer, are copied back from a backup), and FloatingPointError
  names the parameters. One exception: when the step is checked lazily (which cannot ask the host
  about an edit before the update), a parameter edited outside the optimizer since the previous step
  comes back as m^-1(m(w)), within one rounding of the edited value.
- ``lazy_check`` (the default on GPUs) reads the step's flags at the next ``step()`` instead of right
  away, so a step does not wait for the device; a refused step is then undone at that point.
  ``state_dict()``, ``check()`` and pickling/``deepcopy`` settle it too (``load_state_dict`` discards
  it: the loaded state replaces it); ``check()`` is the one call a training loop makes after its last
  step (``mdlib.experiments.train.fit`` does after every epoch). ``zero_grad()`` does not settle it: that would make
  the host wait for the device at every iteration. p = 2 checks the gradient before the step (SGD keeps
  no second copy to roll back to), which reads it on the host.
- Under ``torch.compile`` (of ``opt.step`` or of a whole training step) the step is traced without a
  host read, so without a graph break (``fullgraph=True`` works): the edit check is done on the device
  (as ``lazy_check`` does), and a step that would make a parameter non-finite is skipped on the device,
  parameters and state left as they were, and reported by the next eager ``check()``. p = 2 is torch's
  compiled SGD. A float lr is a constant of the compiled code (torch's rule): give a tensor lr to
  schedule it without recompiling.
- State of one optimizer is its own: the fused kernels' lr tensors and compile failure live on the
  instance; the compiled kernels are shared, keyed by layout (pure functions of their arguments).

``mirror_descent`` is the optimizer (param groups, state, ``state_dict``; what checkpoints of earlier
versions lack, in ``__setstate__``) and its update ``lp_mirror_descent``; beside it, one job each: what makes a step safe to take and to take back, the edit check, the pending
finiteness check and the undo (``mdlib.optim._guard``), the eager steps (``mdlib.optim._steps``), what runs
through ``torch.compile`` (``mdlib.optim._compiled``), and what the optimizer refuses (``mdlib.optim._checks``).
"""

from mdlib.optim.mirror_descent import LpMirrorDescent, LpUpdate, lp_mirror_descent

__all__ = ["LpMirrorDescent", "LpUpdate", "lp_mirror_descent"]

"""posbias: position bias in long-context transformers.

Packages, one job each:
  models      load a pretrained RoPE causal LM (HF folder, .gguf, or the alias ``smollm2-135m``)
  tasks       seeded long-context task generators (kv, mdqa, passkey, niah)
  evaluation  scoring (teacher-forced and greedy), metrics, resumable position-accuracy runs
  patching    Hugging Face patches: per-layer RoPE scaling (LPES)
  search      Bézier / linear / step curves and the curve-constrained genetic algorithm
  methods     registry of inference-time methods (none, pi, lpes, ms-poe, attention-buckets, moice)
  positional  positional schemes for trained models (rope, sinusoidal, nope, alibi, ggd, kerple, fire)
  attention   the attention kernel and normalisers (softmax, SSMax)
  bam         the trainable Llama-style LM with a pluggable positional scheme
  training    data packing and the training loop
  cli         the ``posbias`` command
"""

__version__ = "0.1.0"

"""posbias: position bias in long-context transformers.

Packages, one job each:
  architecture  what posbias reads off a decoder: its layers and each layer's RoPE layout
  models        load a pretrained RoPE causal LM: HF folder, .gguf, Hub id, packaged alias or adapter;
                device, dtype, content identity
  tasks         seeded task generators: kv, kv-uuid, mdqa (NQ-Open, HotpotQA), passkey, niah
  evaluation    scoring (teacher-forced, shared contexts, generation), the attention diagnostic, runs,
                compare, map, ability, stats, plots
  patching      per-layer RoPE scaling (LPES), curves, factors files
  search        the curve-constrained genetic algorithm, fitness, evaluators, tune
  methods       inference-time methods behind one registry: none, pi, lpes, ms-poe, attention-buckets,
                moice, temperature, positional-hidden
  positional    positional schemes for trained models: rope, sinusoidal, nope, alibi, ggd, kerple, fire
  attention     the attention kernel and normalisers (softmax, SSMax)
  bam           the trainable Llama-style LM with a pluggable positional scheme
  training      data packing, tokenizers, probes, the training loop, MoICE routers
  study         the length-extrapolation study
  utils         atomic io, run folders, options, devices, threads, memory
  cli           the ``posbias`` command
"""

__version__ = "0.1.0"

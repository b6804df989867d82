"""Training of draft heads on CPU (`verispec train-head`): prompts from installed
material (material.py), the target's own responses (responses.py), teacher-forced
features (features.py), sparse-distillation losses (losses.py), the training loop
(trainer.py), and the pipeline tying them together with caching and resume
(pipeline.py)."""

"""What a training step does to the numbers, wherever it runs: the optimizers and their state
(optim.py: sgd, momentum, adam; the mean of gradients in worker order) and gradient compression
with error feedback (compressor.py: fp16, top-k). Pure numpy."""

"""``python -m bench models``: whole CNNs on each Vulkan device next to their peers
(``cli``: the command; ``models``: the model set; ``run``: a row; ``flops``: what a
model asks of a device; ``peers``; ``report``: the tables)."""

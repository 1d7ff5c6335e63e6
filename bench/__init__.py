"""vkml's performance comparison tool (``python -m bench``, ``vkml-bench``)."""

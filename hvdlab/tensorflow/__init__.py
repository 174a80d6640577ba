"""Lab code on TensorFlow: co-design comparisons and sync-mode runs."""

"""The operator's routes, beside the two dialects: the queue (pause, reorder, cancel, re-render
batches), health, the media files, and the workers' internal calls."""

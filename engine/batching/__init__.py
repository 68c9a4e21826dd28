"""Batching: the one rule that cuts a batch (`cut`), collating records into one forward pass (`collate`,
`spans`, `collate_media`) and splitting a failed batch (`split`)."""

"""The service's batcher: cuts batches within the engine's limits (`batcher`, `adaptive`) and runs them on
one GPU thread (`gpu`), in priority classes (`classes`); `engine_batcher` puts a `ServingEngine` behind it."""

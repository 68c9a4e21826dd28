"""consumer/batching"""

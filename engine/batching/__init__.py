"""engine/batching"""

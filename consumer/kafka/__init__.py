"""consumer/kafka"""

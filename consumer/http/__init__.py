"""consumer/http"""

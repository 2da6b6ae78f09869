"""Shared pieces of the splitspec services: config, errors, request parameters, devices,
model loading, gRPC plumbing and the local launcher."""

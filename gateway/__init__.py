"""The gateway: public REST (OpenAI-compatible) and gRPC APIs, speculation policy, routing."""

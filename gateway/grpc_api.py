"""The public gRPC Generation service: the same front door as REST, protobuf in and out."""

from __future__ import annotations

import uuid

from gateway.frontend import Frontend
from splitspec.errors import InvalidArgument
from splitspec.wire import sampling_from_pb, speculation_from_pb, stopping_from_pb
from protos import generation_pb2, generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, frontend: Frontend):
        self._frontend = frontend

    async def Generate(self, request, context):
        which = request.WhichOneof("prompt")
        if which is None or (which == "text" and not request.text) or (
                which == "token_ids" and not request.token_ids.ids):
            raise InvalidArgument("prompt", "is required (text or token_ids)")
        prompt = request.text if which == "text" else list(request.token_ids.ids)
        pb = await self._frontend.build_request(
            request.request_id or "gen-" + uuid.uuid4().hex, prompt,
            sampling_from_pb(request.sampling, request.HasField("sampling")).validate(),
            stopping_from_pb(request.stopping, request.HasField("stopping")).validate(),
            speculation_from_pb(request.speculation))
        async for msg in self._frontend.stream(pb):
            yield msg

    async def ListModels(self, request, context):
        info = await self._frontend.pool.info()
        return generation_pb2.ListModelsResponse(models=[generation_pb2.ModelCard(
            id=info.model, speculation_methods=[p.method for p in info.proposers],
            max_model_len=info.max_model_len)])

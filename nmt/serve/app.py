"""`nmt serve`: the HTTP API and the web page (FastAPI + uvicorn, optional extra `nmt[serve]`).

Routes (JSON unless noted; errors are `{"error": "one line"}` with a 4xx/5xx status, every exception
answered through the one map of nmt/serve/failures.py):

    GET  /               the web page (static files in nmt/serve/web, no build step, no CDN)
    GET  /health         {"status": "ok"} once the model is loaded (the port opens only then)
    GET  /info           model, checkpoint, config summary, decoding defaults, limits, eval scores
    POST /translate      {"text": str | [str], "beam"?, "nbest"?, "len_penalty"?} → {"translations": [...]}
    POST /attention      {"text": str, "translation"?: str, "layer"?: int} → source/target pieces + weights
    GET  /run/curves     the training scalars (nmt/run/log.py)
    GET  /run/evals      the run's eval reports, summarised
    GET  /docs           the OpenAPI page FastAPI serves

LibreTranslate's API is served too (nmt/serve/libretranslate.py): POST /translate with `q` instead
of `text`, /languages, /detect, /frontend/settings; any origin may call the app (CORS).

Sentences of concurrent requests are decoded together by `nmt.serve.batcher.Batcher`; every output
is what `nmt translate` prints for the same line and settings.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from nmt.decode.options import InferenceOptions
from nmt.errors import NmtError
from nmt.run.log import curves_to_json, eval_summary, read_curves, read_eval_reports
from nmt.serve import failures
from nmt.serve.batcher import Batcher, BatchLimits, Decoding
from nmt.serve.libretranslate import LibreAccess, LibreTranslate
from nmt.serve.requests import (
    ApiError,
    AttentionRequest,
    TranslateRequest,
    body_schema,
    decode_json,
    parse,
    read_body,
    read_json,
)
from nmt.serve.workers import InProcessWorker, ModelWorkers

WEB_DIR = Path(__file__).resolve().parent / "web"


@dataclass
class ServeLimits:
    """What one request may ask for; beyond it the answer is 413 (size) or 422 (values)."""

    max_sentences: int = 64  # sentences per request
    max_chars: int = 2000  # characters per sentence
    max_body_bytes: int = 1 << 20  # request body
    max_beam: int = 16
    batch: BatchLimits = field(default_factory=BatchLimits)


# --------------------------------------------------------------------------- the service


class Service:
    """The model workers with their batcher, defaults and limits; the routes call its methods."""

    def __init__(self, workers: ModelWorkers, run_dir: Path, limits: ServeLimits, beam: int | None = None) -> None:
        """`workers`: the loaded model (`nmt.serve.workers`); the service owns them from then on."""
        self.facts = workers.facts
        d = self.facts.config.decode
        self.run_dir, self.limits = Path(run_dir), limits
        self.default = Decoding(beam=beam or d.beam, nbest=1, len_penalty=float(d.len_penalty))
        self.batcher = Batcher(workers, limits.batch)
        ckpt = self.facts.checkpoint  # the name is fixed once loaded (resolving it per request cost ~0.1 ms)
        run_name = self.run_dir.resolve().name
        self.model_name = f"{run_name}/{Path(ckpt).name}" if ckpt else run_name
        self.engine_info = {"engine": self.facts.engine, "precision": self.facts.precision, "device": self.facts.device}

    @classmethod
    def load(cls, opts: InferenceOptions, run_dir: Path, limits: ServeLimits) -> Service:
        """Load the model of `opts` (`InferenceOptions`) on `limits.batch.workers` workers (0 =
        `auto_workers`): one in this process, or several in child processes that share the cores
        (cores // workers intra-op threads each, set after loading so that the int8 kernel
        resolves as for `nmt translate` and the answers equal what it prints); nmt/serve/workers.py."""
        from nmt.hw.cores import available_cores

        count = limits.batch.workers or auto_workers(opts, run_dir)
        limits = replace(limits, batch=replace(limits.batch, workers=count))
        if count == 1:
            workers = ModelWorkers.in_process(lambda: InProcessWorker.load(opts))
        else:
            workers = ModelWorkers.in_children(opts, count, max(1, available_cores() // count))
        return cls(workers, run_dir, limits, opts.beam)

    # requests

    def settings(self, req: TranslateRequest) -> Decoding:
        lim, beam = self.limits, self.default.beam if req.beam is None else req.beam
        if not 1 <= beam <= lim.max_beam:
            raise ApiError(422, f"beam: {beam} is out of range (1..{lim.max_beam})")
        if not 1 <= req.nbest <= beam:
            raise ApiError(422, f"nbest: {req.nbest} is out of range (1..beam={beam})")
        lp = self.default.len_penalty if req.len_penalty is None else float(req.len_penalty)
        if not (math.isfinite(lp) and 0.0 <= lp <= 10.0):
            raise ApiError(422, f"len_penalty: {lp} is out of range (0..10)")
        return Decoding(beam, req.nbest, lp)

    def check_lines(self, lines: list[str]) -> None:
        lim = self.limits
        if not lines:
            raise ApiError(422, "text: the list of sentences is empty")
        if len(lines) > lim.max_sentences:
            raise ApiError(413, f"text: {len(lines)} sentences, the limit is {lim.max_sentences} per request")
        for i, line in enumerate(lines):
            if len(line) > lim.max_chars:
                raise ApiError(413, f"text[{i}]: {len(line)} characters, the limit is {lim.max_chars}")

    async def translate(self, req: TranslateRequest) -> dict[str, Any]:
        lines = [req.text] if isinstance(req.text, str) else req.text
        self.check_lines(lines)
        s = self.settings(req)
        start = time.perf_counter()
        try:
            found = await self.batcher.translate(lines, s)
        except Exception as e:
            raise failures.api_error(e) from None
        entries = []
        for hyps in found:
            entry: dict[str, Any] = {"text": hyps[0][0], "score": hyps[0][1]}
            if s.nbest > 1:
                entry["nbest"] = [{"text": t, "score": sc} for t, sc in hyps]
            entries.append(entry)
        return {
            "translations": entries,
            "model": self.model_name,
            "settings": {**vars(s), **self.engine_info},  # vars: no deep copy (asdict) per request
            "seconds": round(time.perf_counter() - start, 4),
        }

    async def attention(self, req: AttentionRequest) -> dict[str, Any]:
        self.check_lines([req.text] + ([req.translation] if req.translation else []))
        target = req.translation
        try:
            if target is None:
                target = (await self.batcher.translate([req.text], self.default))[0][0][0]
            amap = await self.batcher.run("attention", req.text, target, req.layer)
        except Exception as e:
            raise failures.api_error(e) from None
        return {**amap, "translation": target, "layer": req.layer}

    # descriptions

    @property
    def batch_counts(self) -> dict[str, int]:
        """Model calls made so far, the sentences they decoded, and the most in one call."""
        st = self.batcher.stats
        return {
            "model_calls": st.batches,
            "sentences_decoded": st.sentences,
            "largest_call": st.largest,
            "sentences_in_flight": self.batcher.outstanding,
        }

    def info(self) -> dict[str, Any]:
        from nmt.run.checkpoints import checkpoint_step

        c, f = self.facts.config, self.facts
        step = None
        with contextlib.suppress(Exception):
            step = checkpoint_step(Path(f.checkpoint)) if f.checkpoint else None
        m = c.model
        model = {k: getattr(m, k) for k in ("d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim")}
        return {
            "model": self.model_name,
            "run": str(self.run_dir),
            "checkpoint": f.checkpoint,
            "step": step,
            "config": {"name": c.name, "corpus": c.data.corpus, **model, "max_positions": m.max_positions},
            "languages": {"source": c.data.src_lang, "target": c.data.tgt_lang},  # data.direction
            "vocab": {"src": f.src_vocab, "tgt": f.tgt_vocab},
            "decoding": {**asdict(self.default), **self.engine_info},
            "limits": {k: v for k, v in asdict(self.limits).items() if k != "batch"},
            "batching": {**asdict(self.limits.batch), "threads_per_worker": f.threads, **self.batch_counts},
            "attention_maps": f.attention_maps,
            "eval": [eval_summary(r) for r in read_eval_reports(self.run_dir)],
        }


def auto_workers(opts: InferenceOptions, run_dir: Path | None = None) -> int:
    """`--workers 0` for `opts` (`InferenceOptions`) of `run_dir`'s model: with the native engine on
    a CPU one per core, at most 4 (more workers split the same load into smaller batches; measured
    on 2 cores only); on a GPU 1 (its kernels already use the whole device), and with CTranslate2
    (named, or chosen by `--engine auto`: `nmt.decode.loading.resolve_engine`) 1 (it keeps its
    own threads)."""
    from nmt.decode.loading import resolve_engine
    from nmt.hw.cores import available_cores
    from nmt.hw.device import resolve_device

    engine = opts.engine
    if engine == "auto":
        engine = resolve_engine(engine, Path(run_dir or opts.run_dir), opts.checkpoint, opts.ensemble).name
    if engine != "native" or resolve_device(opts.device).type == "cuda":
        return 1
    return min(available_cores(), 4)


# --------------------------------------------------------------------------- the app


def create_app(service: Service, access: LibreAccess | None = None) -> FastAPI:
    """The FastAPI app around a loaded `Service`; the batcher runs for the app's lifetime.
    `access`: who may use the LibreTranslate routes (default: anyone, no limit)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        service.batcher.start()
        yield
        await service.batcher.close()  # after uvicorn has finished the requests in flight

    app = FastAPI(title="nmt", summary="Chinese→English translation", lifespan=lifespan)
    app.state.service = service
    failures.install(app)  # every exception answered through the one map (nmt/serve/failures.py)
    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    libre = LibreTranslate(service, access or LibreAccess())
    libre.install(app)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": service.model_name}

    @app.get("/info")
    def info() -> dict[str, Any]:
        return service.info()

    @app.post("/translate", openapi_extra=body_schema(TranslateRequest), response_class=JSONResponse)
    async def translate(request: Request) -> JSONResponse:
        """Translate one sentence or a list; outputs in input order, n-best with scores. A form body, or
        a `q` field and no `text`, is a LibreTranslate request instead (nmt/serve/libretranslate.py)."""
        body = await read_body(request, service.limits.max_body_bytes)
        if (fields := await libre.claim(request, body)) is not None:
            return await libre.translate(request, fields)
        req = parse(TranslateRequest, decode_json(body))
        return JSONResponse(await service.translate(req))  # plain JSON: no response-model pass per request

    @app.post("/attention", openapi_extra=body_schema(AttentionRequest))
    async def attention(request: Request) -> dict[str, Any]:
        """Cross-attention between a sentence's source pieces and a translation's target pieces."""
        req = parse(AttentionRequest, await read_json(request, service.limits.max_body_bytes))
        return await service.attention(req)

    _add_run_routes(app, service.run_dir)
    return app


def _add_run_routes(app: FastAPI, run_dir: Path) -> None:
    """What the page draws of the run: its training curves and eval reports. Plain `def`s: the
    files are read in FastAPI's thread pool, not on the event loop."""

    @app.get("/run/curves")
    def curves() -> dict[str, Any]:
        return curves_to_json(read_curves(run_dir))

    @app.get("/run/evals")
    def evals() -> list[dict[str, Any]]:
        return [eval_summary(r) for r in read_eval_reports(run_dir)]


# --------------------------------------------------------------------------- the server


@dataclass
class ServeOptions:
    """Where `nmt serve` listens and what it accepts."""

    host: str = "127.0.0.1"
    port: int = 8080  # 0: any free port (printed)
    limits: ServeLimits = field(default_factory=ServeLimits)
    log_level: str = "info"
    access: LibreAccess = field(default_factory=LibreAccess)  # API keys and request limit of the LibreTranslate routes


def serve(opts: InferenceOptions, server: ServeOptions) -> None:
    """Load the model of `opts` (`InferenceOptions`), then open the port and serve until SIGINT/SIGTERM.

    Shutdown is graceful: no new connections, requests in flight are answered, then the
    batcher stops. The socket is bound before uvicorn starts, so a busy port is a one-line error.
    """
    import socket

    import uvicorn

    from nmt.run.dirs import resolve_run

    _, run_dir = resolve_run(None, str(opts.run_dir) if opts.run_dir is not None else None)
    sock = socket.socket(socket.AF_INET6 if ":" in server.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((server.host, server.port))  # bound (a busy port fails fast), listening only once loaded
    except OSError as e:
        sock.close()
        raise NmtError(f"--host {server.host} --port {server.port}: cannot listen there ({e.strerror})") from None
    port = sock.getsockname()[1]
    try:
        service = Service.load(opts, run_dir, server.limits)
    except BaseException:
        sock.close()
        raise
    f = service.facts
    config = uvicorn.Config(
        create_app(service, server.access), log_level=server.log_level, timeout_graceful_shutdown=None
    )
    print(
        f"nmt serve: {service.model_name} ({f.engine}, {f.precision}, {f.device}, "
        f"{service.batcher.workers.count} workers) on http://{server.host}:{port}/  (API docs: /docs; Ctrl-C to stop)",
        flush=True,
    )
    uvicorn.Server(config).run(sockets=[sock])

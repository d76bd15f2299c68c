"""The run directory: everything one experiment made, in `runs/<name>/`, described here once.

    config.yaml                the resolved config (`dirs.init_run`)
    <stage>.stamp.json         the hash of a stage's inputs: a finished stage is skipped, a stale one redone (`stamps`)
    corpus/{train,valid,test}.{zh,en}, corpus/stats.json, corpus/test.codes (optional)
    vocab/{zh,en}.model        SentencePiece models
    bin/{split}.{zh,en}.npy    int32 token ids, and {split}.{zh,en}.offsets.npy
    checkpoints/               step_<N>.safetensors + step_<N>.state.pt, best.safetensors, final.safetensors
    export/ct2-<checkpoint>-<type>/  the CTranslate2 export of a checkpoint, the engine's cache (`nmt.export`)
    tb/, train.log             the training log (`log`)
    eval/*.json                eval reports

Folders (`dirs`): `runs/latest` is a symlink to the run that a stage command (download, vocab,
train, pipeline) last set up under `runs/`; stage commands given neither `--config` nor `--run`
use it. Commands that load a model (translate, eval, average, serve) default instead to the
newest run under `runs/` that has a model, so a benchmark or a run still preparing its data never
takes over the default. Runs outside `runs/` never touch a `latest` link.

Checkpoints (`checkpoints`, no PyTorch): a step checkpoint is complete when its weights file
(written last) has its state file beside it. When no checkpoint is named, a command loads
final.safetensors (the pipeline's choice on validation) if it was chosen after the run's newest
training, else best.safetensors (best validation BLEU), else the newest complete step; the
"loaded ..." line says which and why. Reading the safetensors header directly keeps
`nmt translate --engine ctranslate2` free of PyTorch.

Weights (`weights`, PyTorch): fp32 safetensors with the resolved config and step in their
metadata, and the trainer state (`torch.save` of plain values, `weights_only=True`), written
atomically; averaging of the last checkpoints.

The log (`log`): TensorBoard scalars and `train.log` lines written during training, read back by
the server and `nmt plot`.
"""

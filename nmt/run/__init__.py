"""The run directory: everything one experiment made, described here once.

The names below are spelled once, by `layout.RunDir` (`RunDir(path).vocab_model("zh")`,
`.checkpoints`, `.eval_report("test")`, `.stamp("train")`); every other module asks it.

    runs/<name>/
      config.yaml                       the resolved config (`dirs.init_run`)
      corpus/{train,valid,test}.{zh,en} one sentence per line; valid/test are the raw references
                                        (only whitespace-stripped), never filtered
      corpus/test.codes                 optional per-line codes (cmn_Hans / cmn_Hant)
      corpus/stats.json                 counts kept and dropped per cleaning rule; bad lines by reason;
                                        with data.corpora, each training corpus's counts, weight and pairs
      corpus/manifest.json              sha256 and line count of every corpus file
      corpus/DATA.md                    the training corpora, their sources and licences (research-only flagged)
      corpus/<set>.{zh,en}              the more test sets of data.eval_sets (e.g. wmt_news.test)
      corpus.work/                      cleaned units while the corpus stage runs (a killed run resumes there)
      vocab/{zh,en}.model, .vocab       SentencePiece models; vocab/sample.{zh,en}: the lines they trained on
      bin/{split}/manifest.json         pairs, shards, token dtypes, bytes and sha256 of every file
      bin/{split}/sNNNN.{zh,en}.tok     a shard's ids, concatenated, uint16 (uint32 over 65,535 pieces)
      bin/{split}/sNNNN.{zh,en}.len     uint32 pieces per sentence (the lengths index)
      checkpoints/step_<N>.safetensors  weights; metadata {"config": yaml, "step": "N"}
      checkpoints/step_<N>.state.pt     trainer state (torch.save of plain tensors/ints)
      checkpoints/best.safetensors      best validation BLEU
      checkpoints/averaged.safetensors  mean of the last train.keep_last step checkpoints
      checkpoints/final.safetensors     the model the pipeline chose on validation (averaged or best);
                                        metadata also {"selected": name, "trained_to": newest step then}
      export/ct2-<checkpoint>-<type>/   a CTranslate2 export, the engine's cache (`nmt.export`)
      tb/, train.log                    the training log (`log`)
      eval/<name>.{hyp,json,md}         hypotheses, report (scores, signatures, settings, speed), table
      <stage>.stamp.json                the hash of a finished stage's inputs (`stamps`)
      pipeline-error.log                the traceback of a pipeline stage after training that failed
      .prepared-<launch>                a torchrun launch's rank 0 has prepared the data
    runs/latest -> <name>

Which run (`dirs`): `runs/latest` is a symlink to the run that a stage command (download, vocab,
train, pipeline) last set up under `runs/`; stage commands given neither `--config` nor `--run`
use it. Commands that load a model (translate, eval, average, serve) given no `--run` use
instead the run under `runs/` whose model files were written last (`dirs.newest_model_run`), so
a benchmark or a run still preparing its data never takes over the default. Runs outside
`runs/`, and benchmarks (`init_run(..., latest=False)`), never move the link.

Stamps (`stamps`): each stage writes the hash of its inputs, so that a finished stage is
skipped and a stale one is redone.

Which checkpoint (`checkpoints`, without PyTorch, so that `nmt translate --engine ctranslate2`
never imports it): a step checkpoint is complete when its weights (written last) have their
state file beside them. When none is named, a command loads `final.safetensors` if it was
chosen after the run's newest training (its `trained_to` is the newest complete step), else
`best.safetensors`, else the newest complete step checkpoint
(`checkpoints.choose_inference_checkpoint`), and says so on stderr:
`loaded runs/tiny/checkpoints/best.safetensors (step 200; best validation BLEU)`.

Weights (`weights`, PyTorch): saved atomically, loaded, averaged. The log (`log`): TensorBoard
scalars and `train.log` lines written by training, read back by the server and `nmt plot`.
"""

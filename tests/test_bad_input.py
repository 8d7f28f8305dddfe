"""The catalogue of bad input: every case exits non-zero with one line naming the input, before Ray starts, and
writes nothing — no file created or changed anywhere under the working folder's parent: no MLflow store or run, no
registered version, no lock file, no ``ray_results/``."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from support import (
    encoder_folder,
    register_tiny_classifier,
    register_tiny_encoder,
    run_cli_forked,
    run_cli_in_one_process,
)

from ropim.checks import visible_gpus
from ropim.tracking.runs import write_run_meta
from ropim.train.pretrain.config import PretrainConfig

PRE = ("pretrain", "--preset", "digits_demo")
FT = ("finetune", "--preset", "digits_demo", "--encoder", "ENC")
GR = ("graft", "--preset", "digits_demo", "--encoder", "GENC")  # GENC: a real encoder of one block
SEG = ("segment", "--preset", "digits_seg", "--encoder", "ENC")
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
CASES = {  # id: (argv, what the one line must name)
    "rho above 1": ((*PRE, "--model.rho", "1.5"), "rho=1.5"),
    "rho zero": ((*PRE, "--model.rho", "0"), "rho=0"),
    "rho nan": ((*PRE, "--model.rho", "nan"), '"model.rho"'),
    "patch does not divide": ((*PRE, "--model.img_size", "30"), "patch size must divide"),
    "negative image size": ((*PRE, "--model.img_size", "-32"), "model.img_size=-32"),
    "unknown architecture": ((*PRE, "--model.arch", "vit_giant_patch14"), "arch='vit_giant_patch14'"),
    "unknown backbone": ((*PRE, "--model.backbone", "swin"), "backbone='swin'"),
    "unknown hashing": ((*PRE, "--model.hashing", "weird"), "hashing='weird'"),
    "greyscale in_chans": ((*PRE, "--model.in_chans", "1"), "model.in_chans=1"),
    "unknown corruption": ((*PRE, "--model.corruption", "blur"), "corruption='blur'"),
    "mask ratio above 1": ((*PRE, "--model.corruption", "mask", "--model.mask_ratio", "1.5"), "mask_ratio=1.5"),
    "drop path above 1": ((*PRE, "--model.drop_path_rate", "1.2"), "model.drop_path_rate=1.2"),
    "base_lr nan": ((*PRE, "--base_lr", "nan"), '"base_lr"'),
    "base_lr nan in a config file": ((*PRE, "--config", "nan.yaml"), "base_lr=nan"),
    "base_lr negative": ((*PRE, "--base_lr", "-1"), "base_lr=-1"),
    "weight decay negative": ((*PRE, "--weight_decay", "-0.1"), "weight_decay=-0.1"),
    "beta2 above 1": ((*PRE, "--beta2", "1.5"), "beta2=1.5"),
    "clip_grad negative": ((*PRE, "--clip_grad", "-1"), "clip_grad=-1"),
    "log_every zero": ((*PRE, "--log_every", "0"), "log_every=0"),
    "checkpoint_every zero": ((*PRE, "--checkpoint_every", "0"), "checkpoint_every=0"),
    "stop_after_epochs zero": ((*PRE, "--stop_after_epochs", "0"), "stop_after_epochs=0"),
    "seed negative": ((*PRE, "--seed", "-1"), "seed=-1"),
    "seed too large": ((*PRE, "--seed", "3000000000"), "seed=3000000000"),
    "epochs zero": ((*PRE, "--epochs", "0"), "epochs=0"),
    "epochs not a number": ((*PRE, "--epochs", "abc"), '"epochs"'),
    "batch not divisible": ((*PRE, "--global_batch_size", "10", "--num_workers", "3"), "not divisible"),
    "warm-up negative": ((*PRE, "--warmup_epochs", "-1"), "warmup_epochs=-1"),
    "run name escapes": ((*PRE, "--run_name", "../escape"), "run_name='../escape'"),
    "run name absolute": ((*PRE, "--run_name", "/tmp/abs"), "run_name='/tmp/abs'"),
    "fp16 on CPU": ((*PRE, "--precision", "fp16"), "precision='fp16' needs use_gpu"),
    "unknown precision": ((*PRE, "--precision", "fp64"), "precision='fp64'"),
    "unknown ingest": ((*PRE, "--ingest", "dask"), "ingest='dask'"),
    "unknown placement": ((*PRE, "--placement_strategy", "spread"), "placement_strategy='spread'"),
    "min_workers above num_workers": ((*PRE, "--min_workers", "3"),
                                      "min_workers=3: must be an integer in [1, num_workers=2]"),
    "odd Mixup batch after an elastic restart": (
        (*FT, "--mixup", "0.8", "--num_workers", "8", "--min_workers", "4", "--batch_size", "96",
         "--wait_for_resources", "true"),
        "even micro batch per worker (here 19 on 5 workers, a count an elastic restart"),
    "odd Mixup micro batch from accumulation": ((*FT, "--mixup", "0.8", "--num_workers", "2", "--batch_size", "12",
                                                 "--accum_steps", "2"),
                                                "even micro batch per worker (here 3 on 2 workers)"),
    "min_workers uneven batch": ((*PRE, "--num_workers", "4", "--min_workers", "3", "--global_batch_size", "64"),
                                 "not divisible by min_workers=3"),
    "missing data": ((*PRE, "--data.source", "no/such/folder"), "no such file or folder"),
    "ImageNet's train still archived": ((*PRE, "--data.source", "archived"),
                                        "holds train/, val/ but "),
    "resume with another rho": (("pretrain", "--resume", "stored", "--model.rho", "0.5"),
                                "--resume stored: model.rho=0.5 (stored 0.14285714285714285) cannot change"),
    "resume with more epochs": (("pretrain", "--resume", "stored", "--epochs", "20", "--num_workers", "1"),
                                "epochs=20 (stored 10) cannot change when continuing a run"),
    "resume a run of another job": (("finetune", "--resume", "stored"), "is a pretrain run, not a finetune run"),
    "run name of another job": ((*FT, "--run_name", "stored"), "is a pretrain run, not a finetune run"),
    "in-process checkpoints continued on Ray": ((*PRE, "--run_name", "local", "--num_workers", "1"),
                                                "was trained in this process (num_workers=0)"),
    "Ray checkpoints continued in-process": ((*PRE, "--run_name", "onray", "--num_workers", "0"),
                                            "was trained on Ray Train workers"),
    "registered model name with a slash": ((*PRE, "--registered_model", "bad name/x"),
                                           "registered_model='bad name/x': MLflow model names hold no '/'"),
    "empty experiment": ((*FT, "--experiment", ""), "experiment='': give the MLflow experiment a name"),
    "empty data section": ((*PRE, "--config", "nodata.yaml"), "data: None is not a mapping of its settings"),
    "batch larger than the data": ((*PRE, "--global_batch_size", "4096"),
                                   "global_batch_size=4096 exceeds the training split"),
    "fine-tune batch larger than the data": ((*FT, "--batch_size", "4096"),
                                             "batch_size=4096 exceeds the training split"),
    "sweep fine-tune batch larger than the data": (
        ("sweep", "--metric", "finetune_top1", "--finetune.batch_size", "4096"),
        "finetune.batch_size=4096 exceeds the training split"),
    "val fraction above 1": ((*PRE, "--data.val_fraction", "1.5"), "val_fraction=1.5"),
    "unknown data format": ((*PRE, "--data.format", "tiff"), '"data.format"'),
    "unknown preset": (("pretrain", "--preset", "nope"), "unknown --preset 'nope'"),
    "unknown command": (("pretrian",), "invalid choice: 'pretrian'"),
    "label strings": ((*PRE, "--data.source", "strings"), "not integers"),
    "label out of range": ((*PRE, "--data.source", "range"), "outside the 3 classes"),
    "corrupt image under fail": (("data", "convert", "corrupt", "out", "--on-bad-image", "fail"), "broken.jpg"),
    "convert onto itself": (("data", "convert", "range", "range"), "is the source itself"),
    "convert into the source": (("data", "convert", "corrupt", "corrupt/out"), "inside the source"),
    # a store that exists (made whole elsewhere: no lock file beside it), holding an encoder and a classifier
    "missing version in an existing store": (("finetune", "--encoder", "models:/ropim-encoder/999"),
                                             "no such registered version"),
    "missing model version in an existing store": (("models", "show", "models:/ropim-encoder/7"),
                                                   "no such registered version"),
    "registered classifier as the encoder": ((*FT[:-1], "models:/ropim-classifier/1"),
                                             "models:/ropim-classifier/1: this is a classifier, where encoder weights"),
    "logged classifier as the encoder": (("probe", "--encoder", "runs:/CLF_RUN/classifier"),
                                         "/classifier: this is a classifier, where encoder weights are expected"),
    "logged model path the run lacks": (("probe", "--encoder", "runs:/CLF_RUN/encoder"),
                                        "/encoder: run CLF_RUN holds no artifact 'encoder' (it holds classifier"),
    "models list where no store is": (("models", "list"), "no tracking store at sqlite:///"),
    "missing alias": (("finetune", "--encoder", "models:/ropim-encoder@nope"), "no alias 'nope'"),
    "missing version": (("finetune", "--encoder", "models:/ropim-encoder/999"), "no such registered version"),
    "missing encoder folder": (("finetune", "--encoder", "no/such/encoder"), "no such local folder"),
    "encoder files in two sub-folders": ((*FT[:-1], "split-encoder"),
                                         "no encoder.safetensors + config.json in"),
    "encoder config without its fields": (("probe", "--encoder", "empty-config-encoder"),
                                          "its config.json lacks arch, img_size, patch_size"),
    "layer decay zero": ((*FT, "--layer_decay", "0"), "layer_decay=0"),
    "label smoothing above 1": ((*FT, "--label_smoothing", "1.5"), "label_smoothing=1.5"),
    "mixup negative": ((*FT, "--mixup", "-1"), "mixup=-1"),
    "erasing above 1": ((*FT, "--reprob", "2"), "reprob=2"),
    "graft from a classifier": (("graft", "--preset", "digits_demo", "--encoder", "CLF"),
                                "this is a classifier, where encoder weights are expected"),
    "graft split beyond the depth": ((*GR, "--lower_blocks", "3"), "lower_blocks=3: the encoder"),
    "graft lr ratio above 1": ((*GR, "--lower_lr_ratio", "1.5"), "lower_lr_ratio=1.5"),
    "graft lr ratio zero": ((*GR, "--lower_lr_ratio", "0"), "lower_lr_ratio=0"),
    "graft momentum 1": ((*GR, "--momentum", "1.0"), "momentum=1.0: must be a number in [0, 1)"),
    "graft momentum negative": ((*GR, "--momentum", "-0.5"), "momentum=-0.5"),
    "graft batch too small for the loss": ((*GR, "--global_batch_size", "2"),
                                           "global_batch_size=2: 1 image per worker micro batch"),
    "segment mask size differs": ((*SEG, "--data.source", "segsize"), "p1.png: mask is 5x5 but the image is 16x12"),
    "segment label out of range": ((*SEG, "--data.source", "seglabel"), "mask holds label 7, outside the 3 classes"),
    "folder pair given to pretraining": ((*PRE, "--data.source", "segsize"),
                                         "holds images/ and masks/: a segmentation folder pair"),
    "segment image without mask": ((*SEG, "--data.source", "segnomask"), "extra.png has no mask in"),
    "segment mask without image": ((*SEG, "--data.source", "segnoimage"), "orphan.png has no image in"),
    "segment patch does not divide crop": (("segment", "--preset", "digits_seg", "--encoder", "enc8", "--crop_size",
                                            "60"), "patch size 8, which must divide the crop size (e.g. crop_size=56)"),
    "segment from a classifier": ((*SEG[:-1], "clf"), "this is a classifier, where encoder weights are expected"),
    "segment one image per worker": ((*SEG, "--batch_size", "2", "--num_workers", "2"),
                                     "needs at least 2 images per worker"),
    "segment one image per micro batch": ((*SEG, "--batch_size", "8", "--num_workers", "2", "--accum_steps", "4"),
                                          "over num_workers=2 × accum_steps=4"),
    "probe k zero": (("probe", "--encoder", "ENC", "--knn_k", "0"), "knn_k=0"),
    "empty kNN bank": ((*PRE, "--eval_train_images", "0"), "eval_train_images=0: must be an integer ≥ 1 (or null)"),
    # a kNN's k above the images it searches would be capped, under a protocol name (k=…) that is false
    "probe k above the train split": (("probe", "--encoder", "ENC", "--knn_k", "5000"),
                                      "knn_k=5000 is more than the 1438 images of the kNN's bank (the train split of"),
    "transfer probe k above the train split": (("transfer", "--encoders", "ENC", "--data", "digits", "--mode", "probe",
                                                "--probe.knn_k", "5000"), "probe.knn_k=5000 is more than the 1438"),
    "kNN k above the bank's sample": ((*PRE, "--eval_every", "1", "--eval_train_images", "10"),
                                      "knn_k=20 is more than the 10 images of the kNN's bank (eval_train_images=10)"),
    "kNN k above the train split": ((*PRE, "--eval_every", "1", "--knn_k", "2000"),
                                    "knn_k=2000 is more than the 1438 images of the kNN's bank (the train split of"),
    "sweep trials stopped part-way": (("sweep", "--stop_after_epochs", "2"), "stop_after_epochs=2: a sweep trains"),
    "sweep kNN k above the train split": (("sweep", "--knn_k", "2000"), "knn_k=2000 is more than the 1438 images"),
    "viz no images": (("viz", "--n_images", "0"), "n_images=0"),
    "sweep rho above 1": (("sweep", "--space", '{"rho": {"grid": [0.1, 1.5]}}'), "rho: values must lie in"),
    "sweep name escapes": (("sweep", "--name", "../x"), "name='../x'"),
    "missing model version": (("models", "show", "models:/ropim-encoder/7"), "no such registered version"),
    "unreachable MLflow": ((*PRE,), "MLflow server unreachable"),
    # credentials in a URI would be logged with the config: refused, and the error line does not repeat them
    "credentials in storage_path": ((*PRE, "--storage_path", f"s3://AKIAEXAMPLE:{SECRET}@bucket/runs"),
                                    "storage_path=s3://bucket/runs (credentials removed)"),
    "credentials in data source": ((*PRE, "--data.source", f"s3://bucket/digits?secret_key={SECRET}"),
                                   "data.source=s3://bucket/digits (credentials removed)"),
    "credentials in finetune storage": ((*FT, "--storage_path", f"s3://AKIAEXAMPLE:{SECRET}@bucket/runs"),
                                        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
    "credentials in convert destination": (("data", "convert", "digits", f"s3://AKIAEXAMPLE:{SECRET}@bucket/d"),
                                           "convert destination=s3://bucket/d (credentials removed)"),
    "credentials in sweep storage": (("sweep", "--storage-path", f"s3://AKIAEXAMPLE:{SECRET}@bucket/sweeps"),
                                     "storage_path=s3://bucket/sweeps (credentials removed)"),
    # files cut short or damaged: one line naming the file, read on the driver before anything starts
    "Parquet shard cut short": ((*PRE, "--data.source", "cut"), "cut/train-00001.parquet cannot be read as Parquet"),
    "Parquet shard cut short, inspect": (("data", "inspect", "cut"), "train-00001.parquet cannot be read as Parquet"),
    "Parquet shard cut short, sweep": (("sweep", "--data.source", "cut"), "train-00001.parquet cannot be read"),
    # images that do not decode, all of them: found in a sample before anything starts
    "no image decodes": ((*PRE, "--data.source", "undecodable"),
                         "undecodable': none of the first 8 images of the training split decodes (s0/0.jpg: "),
    "no image decodes, probe": (("probe", "--encoder", "ENC", "--data.source", "undecodable"),
                                "none of the first 8 images of the training split decodes"),
    "no image decodes, sweep": (("sweep", "--data.source", "undecodable"), "none of the first 8 images"),
    "no image decodes, inspect": (("data", "inspect", "undecodable"),
                                  "undecodable': none of the 200 images sampled decodes"),
    "encoder weights cut short": (("finetune", "--preset", "digits_demo", "--encoder", "cut-encoder"),
                                  "cut-encoder/encoder.safetensors cannot be read"),
    "encoder config not JSON": (("probe", "--encoder", "bad-config-encoder"), "config.json cannot be read"),
    "encoder config of another width": (("probe", "--encoder", "wide-config-encoder"),
                                         "wide-config-encoder: the weights do not fit the VisionTransformer"),
    # results folders that are files: said before the work whose results they would hold
    "viz --out a file": (("viz", "--encoder", "ENC", "--out", "afile"), "--out 'afile' is a file, not a folder"),
    "probe --cache_dir a file": (("probe", "--encoder", "ENC", "--cache_dir", "afile"),
                                 "--cache_dir 'afile' is a file, not a folder"),
    "convert destination under a file": (("data", "convert", "digits", "afile/sub"),
                                         "convert destination 'afile/sub' cannot be created: afile is a file"),
    "inspect sample zero": (("data", "inspect", "digits", "--sample", "0"), "--sample 0: must be ≥ 1"),
    "transfer data set given twice": (("transfer", "--encoders", "ENC", "--data", "digits,,digits", "--mode", "probe"),
                                      "--data lists 'digits' twice"),
    "encoder without version or alias": (("finetune", "--preset", "digits_demo", "--encoder", "models:/ropim-encoder"),
                                         "'models:/ropim-encoder': a registered model is addressed by version or"),
    "encoder run without its folder": (("segment", "--preset", "digits_seg", "--encoder", "runs:/0123abcd"),
                                       "'runs:/0123abcd': a run's model is addressed by the run and its artifact"),
    # segmentation settings that would train to a wrong score
    "segment eval stride above the crop": ((*SEG, "--eval_mode", "slide", "--eval_stride", "200"),
                                           "eval_stride=200 > crop_size="),
    "digits canvases of another class count": ((*SEG, "--data.num_classes", "5"),
                                               "data.num_classes=5 but the built-in digits canvas set names 11"),
    # config files
    "key given twice in a config file": ((*PRE, "--config", "twice.yaml"),
                                         "config file twice.yaml: key 'model.rho' is given twice (lines 2 and 3)"),
    "key given twice in a sweep config": (("sweep", "--config", "twice.yaml"), "key 'model.rho' is given twice"),
    "config file holding a list": ((*PRE, "--config", "list.yaml"), "config file list.yaml: holds a list, not a"),
    "config file with a syntax error": ((*PRE, "--config", "syntax.yaml"),
                                        "config file syntax.yaml: not valid YAML at line 2"),
    "binary config file": ((*FT, "--config", "binary.yaml"), "config file binary.yaml: not a text file"),
}
if not visible_gpus():
    CASES["GPU without a GPU"] = ((*PRE, "--use_gpu", "true"), "use_gpu=true but this machine has no visible GPU")
# the Train workers holding every CPU of the local cluster Ray will start (2 × 1 on 2 CPUs): Ray Data read 0 rows
# until Ray's 30-minute timeout
CASES["Ray Data left no CPU"] = ((*PRE, "--ingest", "ray_data", "--num_workers", "2", "--cpus_per_worker",
                                  f"{(os.cpu_count() or 1) / 2:g}"),
                                 "leaving Ray Data's read and decode tasks 0 (they need 1): the job would read no data")
if (os.cpu_count() or 1) < 16:
    CASES["more worker CPUs than the machine"] = ((*PRE, "--num_workers", "16", "--global_batch_size", "64"),
                                                  "num_workers=16 × cpus_per_worker=1 needs 16 CPUs")


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    """A working folder inside an otherwise empty parent, with the bad data sets the cases name."""
    work = tmp_path_factory.mktemp("bad-input") / "work"
    img = Image.new("RGB", (8, 8))
    (work / "corrupt" / "cls").mkdir(parents=True)
    img.save(work / "corrupt" / "cls" / "ok.png")
    (work / "corrupt" / "cls" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (work / "archived" / "train").mkdir(parents=True)  # ImageNet's train/ as its .tar files, val/ extracted
    (work / "archived" / "train" / "n01440764.tar").write_bytes(b"")
    (work / "archived" / "val" / "n01440764").mkdir(parents=True)
    img.save(work / "archived" / "val" / "n01440764" / "v0.png")
    (work / "strings").mkdir()
    pq.write_table(pa.table({"image": [b"x"], "label": ["cat"]}), work / "strings" / "train-0.parquet")
    (work / "range").mkdir()
    table = pa.table({"image": [b"x", b"y"], "label": pa.array([0, 5], pa.int64()), "path": ["a", "b"]})
    pq.write_table(table.replace_schema_metadata({b"classes": b'["a", "b", "c"]'}), work / "range" / "train-0.parquet")
    encoder_folder(work / "ENC")  # a whole encoder: each case has one bad input
    encoder_folder(work / "GENC")
    (work / "CLF").mkdir()  # a fine-tuned classifier's folder: classifier weights + config
    (work / "CLF" / "classifier.safetensors").write_bytes(b"")
    (work / "CLF" / "config.json").write_text('{"arch": "vit_tiny_patch16_224", "num_classes": 10}')
    write_seg_fixtures(work)
    stored = PretrainConfig(run_name="stored", storage_path=str(work / "ray_results"))  # a run `--resume` continues
    write_run_meta(stored.storage_path, "stored", {"run_id": "0" * 32, "config": stored.to_dict()})
    for name, checkpoint in (("local", "in_process/checkpoint_000001"), ("onray", "checkpoint_2026-11-27_12-00-00")):
        write_run_meta(stored.storage_path, name, {"run_id": "0" * 32, "config": stored.to_dict()})
        (work / "ray_results" / name / checkpoint).mkdir(parents=True)  # where one epoch was kept
    (work / "nodata.yaml").write_text("data:\n#  source: ./images\nepochs: 1\n")  # its keys commented out
    (work / "nan.yaml").write_text("base_lr: .nan\n")
    (work / "afile").write_text("not a folder\n")
    (work / "twice.yaml").write_text("model:\n  rho: 0.2\n  rho: 0.3\n")
    (work / "list.yaml").write_text("- epochs: 3\n- seed: 1\n")
    (work / "syntax.yaml").write_text("epochs: [1\nseed: :\n")
    (work / "binary.yaml").write_bytes(bytes(range(128, 256)))
    (work / "undecodable").mkdir()  # 200 images (2 shards) that are not images
    for k in range(2):
        pq.write_table(pa.table({"image": [b"\xff\xd8\xff\xe0 not a jpeg"] * 100, "label": pa.array([0, 1] * 50),
                                 "path": [f"s{k}/{i}.jpg" for i in range(100)]}),
                       work / "undecodable" / f"train-{k:05d}.parquet")
    (work / "cut").mkdir()
    shard = pa.table({"image": [b"x"], "label": pa.array([0], pa.int64()), "path": ["a"]})
    for k in range(2):
        pq.write_table(shard, work / "cut" / f"train-{k:05d}.parquet")
    whole = (work / "cut" / "train-00001.parquet").read_bytes()
    (work / "cut" / "train-00001.parquet").write_bytes(whole[: len(whole) // 2])  # a copy stopped half-way
    weights = encoder_folder(work / "cut-encoder") / "encoder.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    (encoder_folder(work / "bad-config-encoder") / "config.json").write_text('{"arch": "vit_tiny_patch16_224", ')
    split = encoder_folder(work / "split-encoder" / "weights")  # the weights of one model, the config of another
    (split.parent / "config").mkdir()
    (split / "config.json").rename(split.parent / "config" / "config.json")
    (encoder_folder(work / "empty-config-encoder") / "config.json").write_text("{}")
    wide = encoder_folder(work / "wide-config-encoder") / "config.json"  # ViT-S's config beside ViT-T's weights
    wide.write_text(wide.read_text().replace('"arch": "vit_tiny_patch16_224"', '"arch": "vit_small_patch16_224"'))
    write_registry(work)
    return work


def write_registry(work: Path) -> None:
    """``registry.db``: a store holding a tiny encoder and a classifier built on it (its run id in ``CLF_RUN``),
    without the lock file a job creates beside a store it makes (as a copy, or a store ``mlflow server`` made)."""
    from ropim.tracking import store

    db = work / "registry" / "registry.db"
    db.parent.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
        uri, folder = register_tiny_encoder(db.parent)
        classifier = register_tiny_classifier(uri, folder)
        (work / "CLF_RUN").write_text(store.client().get_model_version("ropim-classifier", classifier[-1]).run_id)
    db.with_name(db.name + ".lock").unlink()


def write_pairs(root: Path, n: int = 3) -> Path:
    """A folder pair of 16x12 images and masks (labels 0..2) with three named classes."""
    import numpy as np

    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    (root / "classes.json").write_text('["a", "b", "c"]')
    for i in range(n):
        Image.new("RGB", (16, 12)).save(root / "images" / f"p{i}.png")
        Image.fromarray(np.full((12, 16), i % 3, np.uint8)).save(root / "masks" / f"p{i}.png")
    return root


def write_seg_fixtures(work: Path) -> None:
    """Segmentation sources that do not fit, a patch-8 encoder, a classifier folder."""
    import numpy as np
    from support import encoder_folder

    from ropim.core.config import ModelConfig

    Image.new("L", (5, 5)).save(write_pairs(work / "segsize") / "masks" / "p1.png")
    Image.fromarray(np.full((12, 16), 7, np.uint8)).save(write_pairs(work / "seglabel") / "masks" / "p1.png")
    Image.new("RGB", (16, 12)).save(write_pairs(work / "segnomask") / "images" / "extra.png")
    Image.new("L", (16, 12)).save(write_pairs(work / "segnoimage") / "masks" / "orphan.png")
    encoder_folder(work / "enc8", ModelConfig(img_size=32, patch_size=8, depth=1))
    (work / "clf").mkdir()
    (work / "clf" / "classifier.safetensors").write_bytes((work / "enc8" / "encoder.safetensors").read_bytes())
    (work / "clf" / "config.json").write_text((work / "enc8" / "config.json").read_text())


def written(work: Path) -> dict[str, tuple[int, int] | None]:
    """Everything under the working folder's parent: each file's size and modification time (folders: None)."""
    return {str(p.relative_to(work.parent)): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else None
            for p in work.parent.rglob("*")}


REGISTRY_CASES = {"missing version in an existing store", "missing model version in an existing store",
                  "registered classifier as the encoder", "logged classifier as the encoder",
                  "logged model path the run lacks"}


def case_env(case: str, work: Path) -> dict:
    """The case's MLflow store: a server that is not there, the store holding models, or a store of its own that
    does not exist (and must not be created)."""
    if case == "unreachable MLflow":
        return {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    if case in REGISTRY_CASES:
        return {"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'registry' / 'registry.db'}"}
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow-{abs(hash(case))}.db"}


def test_catalogue_of_bad_input_is_one_line_before_ray_and_writes_nothing(fixtures):
    before = written(fixtures)
    run = (fixtures / "CLF_RUN").read_text()
    procs = run_cli_forked([([a.replace("CLF_RUN", run) for a in argv], case_env(case, fixtures))
                            for case, (argv, _) in CASES.items()], cwd=fixtures, timeout=900)
    expected = {case: named.replace("CLF_RUN", run) for case, (_, named) in CASES.items()}
    results = dict(zip(CASES, procs, strict=True))
    assert len(CASES) >= 40
    wrong = {}
    for case, proc in results.items():
        lines = proc.stderr.strip().splitlines()
        if proc.returncode == 0 or len(lines) != 1 or expected[case] not in lines[0] or "Ray" in proc.stdout \
                or SECRET in proc.stdout + proc.stderr:
            wrong[case] = (proc.returncode, proc.stderr[-600:])
    assert not wrong, wrong
    after = written(fixtures)
    changed = {p: (before.get(p), after.get(p)) for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert not changed, changed  # no store, lock file, run, version, ray_results, shard: nothing outside the folder


def test_a_classifier_given_as_the_encoder_is_refused_before_torch_is_imported(fixtures):
    """From the registered version's tags or the logged model's name, in pre-flight: no weights are read."""
    run = (fixtures / "CLF_RUN").read_text()
    argvs = [[*FT[:-1], "models:/ropim-classifier/1"], ["probe", "--encoder", f"runs:/{run}/classifier"]]
    proc = run_cli_in_one_process(argvs, ("torch", "ray", "timm", "safetensors"), fixtures,
                                  case_env("registered classifier as the encoder", fixtures))
    out = proc.stdout + proc.stderr
    assert "HEAVY []" in out, out[-3000:]
    assert out.count("this is a classifier, where encoder weights are expected") == 2, out[-3000:]

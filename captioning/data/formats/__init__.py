"""The dataset formats: one module each, and in it one reader registered under the data.dataset
names it reads (captioning.config.registry.DATASETS): (data, split) -> that split's image records.

  karpathy.py       Karpathy-style split files: coco, flickr8k, flickr30k, karpathy
  coco_official.py  COCO's official captions files, through pycocotools: coco_official
  folder.py         a folder of your own images and a captions file: folder
  shapes.py         the shapes data the project draws: shapes

A reader reads; it never makes data (`captioning make-shapes` draws the shapes data).
"""

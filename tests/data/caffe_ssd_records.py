#!/usr/bin/env python3
"""Caffe SSD's detection records, written and read by Python's protobuf.

The message classes come from tests/data/caffe_ssd.proto (the published Caffe SSD field
numbers), compiled by protoc into PYTHONPATH by the test, so nothing here is shared with
Cortado's data/datum.proto or its generated C++ (tests/data/annotated_datum_test.cpp runs it).

  caffe_ssd_records.py write SPEC.json OUT_DIR
      For each record of the spec, writes OUT_DIR/<i>.bin as Caffe SSD's convert_annoset does
      (ReadRichImageToAnnotatedDatum): the image in the Datum (encoded, or raw BGR planes),
      label -1, type BBOX, one annotation group per class in the order classes first appear,
      instance ids counting within each group.
  caffe_ssd_records.py read RECORD
      Prints the record as JSON (datum fields, type, groups); fails on unknown fields.
  caffe_ssd_records.py labelmap FILE
      Prints a label map (protobuf text format) as JSON: [[name, label, display_name], ...].
"""
import json
import sys

from google.protobuf import text_format

import caffe_ssd_pb2 as pb


def write(spec_path, out_dir):
    with open(spec_path) as f:
        spec = json.load(f)
    for i, rec in enumerate(spec):
        anno = pb.AnnotatedDatum()
        d = anno.datum
        d.channels = rec["channels"]
        d.height = rec["height"]
        d.width = rec["width"]
        with open(rec["image"], "rb") as f:
            d.data = f.read()
        d.encoded = rec["encoded"]
        d.label = -1
        anno.type = pb.AnnotatedDatum.BBOX
        groups = {}
        for box in rec["boxes"]:
            label = box["label"]
            if label not in groups:
                groups[label] = anno.annotation_group.add()
                groups[label].group_label = label
            group = groups[label]
            a = group.annotation.add()
            a.instance_id = len(group.annotation) - 1
            a.bbox.xmin = box["xmin"]
            a.bbox.ymin = box["ymin"]
            a.bbox.xmax = box["xmax"]
            a.bbox.ymax = box["ymax"]
            a.bbox.difficult = box["difficult"]
        with open("%s/%d.bin" % (out_dir, i), "wb") as f:
            f.write(anno.SerializeToString())


def unknown_fields(message):
    """Counts unknown fields in a message and its sub-messages."""
    n = len(message.UnknownFields())
    for field, value in message.ListFields():
        if field.type == field.TYPE_MESSAGE:
            values = value if field.label == field.LABEL_REPEATED else [value]
            n += sum(unknown_fields(v) for v in values)
    return n


def read(path):
    anno = pb.AnnotatedDatum()
    with open(path, "rb") as f:
        anno.ParseFromString(f.read())
    if unknown_fields(anno):
        sys.exit("unknown fields in the record")
    d = anno.datum
    out = {
        "channels": d.channels, "height": d.height, "width": d.width, "label": d.label,
        "encoded": d.encoded, "data": d.data.hex(), "has_type": anno.HasField("type"),
        "type": anno.type,
        "groups": [{
            "label": g.group_label,
            "annotations": [[a.instance_id, a.bbox.xmin, a.bbox.ymin, a.bbox.xmax, a.bbox.ymax,
                             a.bbox.difficult] for a in g.annotation],
        } for g in anno.annotation_group],
    }
    print(json.dumps(out))


def labelmap(path):
    m = pb.LabelMap()
    with open(path) as f:
        text_format.Parse(f.read(), m)
    print(json.dumps([[i.name, i.label, i.display_name] for i in m.item]))


if __name__ == "__main__":
    {"write": lambda: write(sys.argv[2], sys.argv[3]),
     "read": lambda: read(sys.argv[2]),
     "labelmap": lambda: labelmap(sys.argv[2])}[sys.argv[1]]()

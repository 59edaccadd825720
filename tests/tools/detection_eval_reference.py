#!/usr/bin/python3
"""An independent reference for tools/detection_eval.cpp, for tests/tools/detection_eval_test.cpp.

    python3 detection_eval_reference.py IN.json OUT.json

Written from the published definitions, not from the C++ code:
  - VOC: the devkit's voc_eval.py (Ross Girshick's Python port of VOCevaldet.m, used by
    py-faster-rcnn and Caffe SSD's scripts): per class, detections sorted by confidence, each
    compared with the boxes of its image (ovmax, jmax), true positive above 0.5 unless the box
    is taken, ignored on a difficult box; voc_ap with use_07_metric True (11 points) and False
    (area under the envelope). One change: boxes are normalized, so no "+ 1" on widths.
  - COCO: pycocotools' COCOeval.evaluateImg and accumulate for iouType 'bbox' (iscrowd = the
    difficult flag; area = box width x height in pixels for boxes and detections alike), with
    maxDets [max_dets], area ranges all/small/medium/large, and the summary's means over the
    entries > -1.
IN.json: {"num_classes": K, "max_dets": M, "images": [{"index", "width", "height"}],
          "detections": [{"image", "label", "score", "box": [x0, y0, x1, y1]}],
          "boxes": [{"image", "label", "box", "difficult"}]}   (detections in input order)
OUT.json: per class lists (null: no AP) "voc07", "voc", "coco", "coco50", "coco75", "small",
          "medium", "large", and their means "map_voc07", ... ("null" when no class has one).
"""
import json
import sys

import numpy as np


def voc_ap(rec, prec, use_07_metric):
    if use_07_metric:
        ap = 0.0
        for t in np.arange(0.0, 1.1, 0.1):
            if np.sum(rec >= t) == 0:
                p = 0
            else:
                p = np.max(prec[rec >= t])
            ap = ap + p / 11.0
        return ap
    mrec = np.concatenate(([0.0], rec, [1.0]))
    mpre = np.concatenate(([0.0], prec, [0.0]))
    for i in range(mpre.size - 1, 0, -1):
        mpre[i - 1] = np.maximum(mpre[i - 1], mpre[i])
    i = np.where(mrec[1:] != mrec[:-1])[0]
    return np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1])


def voc_eval(data, cls, ovthresh=0.5):
    class_recs = {}
    npos = 0
    for im in data["images"]:
        R = [b for b in data["boxes"] if b["image"] == im["index"] and b["label"] == cls]
        bbox = np.array([b["box"] for b in R], dtype=np.float64).reshape(-1, 4)
        difficult = np.array([bool(b["difficult"]) for b in R], dtype=bool)
        det = [False] * len(R)
        npos = npos + int(np.sum(~difficult))
        class_recs[im["index"]] = {"bbox": bbox, "difficult": difficult, "det": det}
    D = [d for d in data["detections"] if d["label"] == cls]
    image_ids = [d["image"] for d in D]
    confidence = np.array([d["score"] for d in D], dtype=np.float64)
    BB = np.array([d["box"] for d in D], dtype=np.float64).reshape(-1, 4)
    # Equal confidences keep the input order (the devkit's quicksort leaves them unspecified).
    sorted_ind = np.argsort(-confidence, kind="stable")
    BB = BB[sorted_ind, :]
    image_ids = [image_ids[x] for x in sorted_ind]
    nd = len(image_ids)
    tp = np.zeros(nd)
    fp = np.zeros(nd)
    for d in range(nd):
        R = class_recs[image_ids[d]]
        bb = BB[d, :]
        ovmax = -np.inf
        BBGT = R["bbox"]
        if BBGT.size > 0:
            ixmin = np.maximum(BBGT[:, 0], bb[0])
            iymin = np.maximum(BBGT[:, 1], bb[1])
            ixmax = np.minimum(BBGT[:, 2], bb[2])
            iymax = np.minimum(BBGT[:, 3], bb[3])
            iw = np.maximum(ixmax - ixmin, 0.0)
            ih = np.maximum(iymax - iymin, 0.0)
            inters = iw * ih
            uni = ((bb[2] - bb[0]) * (bb[3] - bb[1]) +
                   (BBGT[:, 2] - BBGT[:, 0]) * (BBGT[:, 3] - BBGT[:, 1]) - inters)
            overlaps = inters / uni
            ovmax = np.max(overlaps)
            jmax = np.argmax(overlaps)
        if ovmax > ovthresh:
            if not R["difficult"][jmax]:
                if not R["det"][jmax]:
                    tp[d] = 1.0
                    R["det"][jmax] = 1
                else:
                    fp[d] = 1.0
        else:
            fp[d] = 1.0
    if npos == 0:
        return None, None
    fp = np.cumsum(fp)
    tp = np.cumsum(tp)
    rec = tp / float(npos)
    prec = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    return voc_ap(rec, prec, True), voc_ap(rec, prec, False)


class CocoBoxEval:
    """COCOeval for bounding boxes, on this test's data layout."""

    def __init__(self, data):
        self.max_det = data["max_dets"]
        self.iou_thrs = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1,
                                    endpoint=True)
        self.rec_thrs = np.linspace(0.0, 1.00, int(np.round((1.00 - 0.0) / 0.01)) + 1,
                                    endpoint=True)
        self.area_rngs = [[0 ** 2, 1e5 ** 2], [0 ** 2, 32 ** 2], [32 ** 2, 96 ** 2],
                          [96 ** 2, 1e5 ** 2]]
        self.img_ids = [im["index"] for im in data["images"]]
        self.cat_ids = list(range(1, data["num_classes"] + 1))
        size = {im["index"]: (im["width"], im["height"]) for im in data["images"]}
        self.gts, self.dts = {}, {}
        next_id = 1
        for b in data["boxes"]:
            w, h = size[b["image"]]
            x0, y0, x1, y1 = b["box"]
            g = {"id": next_id, "bbox": [x0, y0, x1 - x0, y1 - y0], "iscrowd": int(b["difficult"]),
                 "area": (x1 - x0) * (y1 - y0) * w * h}
            g["ignore"] = g["iscrowd"]
            next_id += 1
            self.gts.setdefault((b["image"], b["label"]), []).append(g)
        next_id = 1
        for d in data["detections"]:
            w, h = size[d["image"]]
            x0, y0, x1, y1 = d["box"]
            self.dts.setdefault((d["image"], d["label"]), []).append(
                {"id": next_id, "bbox": [x0, y0, x1 - x0, y1 - y0], "score": d["score"],
                 "area": (x1 - x0) * (y1 - y0) * w * h})
            next_id += 1

    @staticmethod
    def iou(dts, gts, iscrowd):
        """maskUtils.iou for boxes [x, y, w, h]: a crowd box divides by the detection's area."""
        out = np.zeros((len(dts), len(gts)))
        for i, d in enumerate(dts):
            for j, g in enumerate(gts):
                w = min(d[0] + d[2], g[0] + g[2]) - max(d[0], g[0])
                h = min(d[1] + d[3], g[1] + g[3]) - max(d[1], g[1])
                if w <= 0 or h <= 0:
                    continue
                inter = w * h
                union = d[2] * d[3] if iscrowd[j] else d[2] * d[3] + g[2] * g[3] - inter
                out[i, j] = inter / union
        return out

    def compute_iou(self, img, cat):
        gt = self.gts.get((img, cat), [])
        dt = self.dts.get((img, cat), [])
        if len(gt) == 0 and len(dt) == 0:
            return []
        inds = np.argsort([-d["score"] for d in dt], kind="mergesort")
        dt = [dt[i] for i in inds]
        if len(dt) > self.max_det:
            dt = dt[0:self.max_det]
        return self.iou([d["bbox"] for d in dt], [g["bbox"] for g in gt],
                        [int(o["iscrowd"]) for o in gt])

    def evaluate_img(self, img, cat, a_rng):
        gt = self.gts.get((img, cat), [])
        dt = self.dts.get((img, cat), [])
        if len(gt) == 0 and len(dt) == 0:
            return None
        for g in gt:
            g["_ignore"] = 1 if (g["ignore"] or (g["area"] < a_rng[0] or g["area"] > a_rng[1])) \
                else 0
        gtind = np.argsort([g["_ignore"] for g in gt], kind="mergesort")
        gt = [gt[i] for i in gtind]
        dtind = np.argsort([-d["score"] for d in dt], kind="mergesort")
        dt = [dt[i] for i in dtind[0:self.max_det]]
        iscrowd = [int(o["iscrowd"]) for o in gt]
        ious = self.ious[img, cat]
        ious = ious[:, gtind] if len(ious) > 0 else ious
        T, G, D = len(self.iou_thrs), len(gt), len(dt)
        gtm = np.zeros((T, G))
        dtm = np.zeros((T, D))
        gtIg = np.array([g["_ignore"] for g in gt])
        dtIg = np.zeros((T, D))
        if not len(ious) == 0:
            for tind, t in enumerate(self.iou_thrs):
                for dind, d in enumerate(dt):
                    iou = min([t, 1 - 1e-10])
                    m = -1
                    for gind, g in enumerate(gt):
                        if gtm[tind, gind] > 0 and not iscrowd[gind]:
                            continue
                        if m > -1 and gtIg[m] == 0 and gtIg[gind] == 1:
                            break
                        if ious[dind, gind] < iou:
                            continue
                        iou = ious[dind, gind]
                        m = gind
                    if m == -1:
                        continue
                    dtIg[tind, dind] = gtIg[m]
                    dtm[tind, dind] = gt[m]["id"]
                    gtm[tind, m] = d["id"]
        a = np.array([d["area"] < a_rng[0] or d["area"] > a_rng[1] for d in dt]).reshape((1, len(dt)))
        dtIg = np.logical_or(dtIg, np.logical_and(dtm == 0, np.repeat(a, T, 0)))
        return {"dtMatches": dtm, "dtScores": [d["score"] for d in dt], "gtIgnore": gtIg,
                "dtIgnore": dtIg}

    def run(self):
        self.ious = {(i, c): self.compute_iou(i, c) for i in self.img_ids for c in self.cat_ids}
        T, R, K, A = len(self.iou_thrs), len(self.rec_thrs), len(self.cat_ids), len(self.area_rngs)
        precision = -np.ones((T, R, K, A))
        for k, cat in enumerate(self.cat_ids):
            for a, a_rng in enumerate(self.area_rngs):
                E = [self.evaluate_img(i, cat, a_rng) for i in self.img_ids]
                E = [e for e in E if e is not None]
                if len(E) == 0:
                    continue
                dtScores = np.concatenate([e["dtScores"][0:self.max_det] for e in E])
                inds = np.argsort(-dtScores, kind="mergesort")
                dtm = np.concatenate([e["dtMatches"][:, 0:self.max_det] for e in E], axis=1)[:, inds]
                dtIg = np.concatenate([e["dtIgnore"][:, 0:self.max_det] for e in E], axis=1)[:, inds]
                gtIg = np.concatenate([e["gtIgnore"] for e in E])
                npig = np.count_nonzero(gtIg == 0)
                if npig == 0:
                    continue
                tps = np.logical_and(dtm, np.logical_not(dtIg))
                fps = np.logical_and(np.logical_not(dtm), np.logical_not(dtIg))
                tp_sum = np.cumsum(tps, axis=1).astype(dtype=float)
                fp_sum = np.cumsum(fps, axis=1).astype(dtype=float)
                for t, (tp, fp) in enumerate(zip(tp_sum, fp_sum)):
                    tp = np.array(tp)
                    fp = np.array(fp)
                    nd = len(tp)
                    rc = tp / npig
                    pr = tp / (fp + tp + np.spacing(1))
                    q = np.zeros((R,))
                    pr = pr.tolist()
                    q = q.tolist()
                    for i in range(nd - 1, 0, -1):
                        if pr[i] > pr[i - 1]:
                            pr[i - 1] = pr[i]
                    inds = np.searchsorted(rc, self.rec_thrs, side="left")
                    try:
                        for ri, pi in enumerate(inds):
                            q[ri] = pr[pi]
                    except IndexError:
                        pass
                    precision[t, :, k, a] = np.array(q)
        return precision


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def main():
    data = json.load(open(sys.argv[1]))
    out = {"voc07": [], "voc": []}
    for cls in range(1, data["num_classes"] + 1):
        ap07, ap = voc_eval(data, cls)
        out["voc07"].append(ap07)
        out["voc"].append(ap)
    precision = CocoBoxEval(data).run()

    def ap(s):
        return float(np.mean(s[s > -1])) if np.any(s > -1) else None

    K = data["num_classes"]
    out["coco"] = [ap(precision[:, :, k, 0]) for k in range(K)]
    out["coco50"] = [ap(precision[0, :, k, 0]) for k in range(K)]
    out["coco75"] = [ap(precision[5, :, k, 0]) for k in range(K)]
    for a, name in ((1, "small"), (2, "medium"), (3, "large")):
        out[name] = [ap(precision[:, :, k, a]) for k in range(K)]
    # COCOeval.summarize: the mean over every entry > -1.
    out["map_coco"] = ap(precision[:, :, :, 0])
    out["map_coco50"] = ap(precision[0, :, :, 0])
    out["map_coco75"] = ap(precision[5, :, :, 0])
    for a, name in ((1, "small"), (2, "medium"), (3, "large")):
        out["map_" + name] = ap(precision[:, :, :, a])
    out["map_voc07"] = mean_or_none(out["voc07"])
    out["map_voc"] = mean_or_none(out["voc"])
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()

#include "data/annotated_datum.h"

#include <cmath>

#include "data/datum.pb.h"
#include "engine/base/error.h"

namespace cortado {

struct AnnotatedDatumParser::Impl {
  caffe::AnnotatedDatum message;
};

std::string SerializeAnnotatedDatum(const DatumFields& fields, std::string_view data,
                                    const std::vector<BoxAnnotation>& boxes) {
  caffe::AnnotatedDatum record;
  caffe::Datum* datum = record.mutable_datum();
  datum->set_channels(fields.channels);
  datum->set_height(fields.height);
  datum->set_width(fields.width);
  datum->set_data(data.data(), data.size());
  datum->set_label(fields.label);
  datum->set_encoded(fields.encoded);
  record.set_type(caffe::AnnotatedDatum::BBOX);
  for (const BoxAnnotation& box : boxes) {
    caffe::AnnotationGroup* group = nullptr;
    for (caffe::AnnotationGroup& g : *record.mutable_annotation_group()) {
      if (g.group_label() == box.label) group = &g;
    }
    if (group == nullptr) {
      group = record.add_annotation_group();
      group->set_group_label(box.label);
    }
    caffe::Annotation* a = group->add_annotation();
    a->set_instance_id(box.instance_id);
    caffe::NormalizedBBox* b = a->mutable_bbox();
    b->set_xmin(box.xmin);
    b->set_ymin(box.ymin);
    b->set_xmax(box.xmax);
    b->set_ymax(box.ymax);
    b->set_difficult(box.difficult);
  }
  std::string out;
  CORTADO_CHECK(record.SerializeToString(&out), "cannot serialize an AnnotatedDatum");
  return out;
}

AnnotatedDatumParser::AnnotatedDatumParser() : impl_(std::make_unique<Impl>()) {}
AnnotatedDatumParser::~AnnotatedDatumParser() = default;

bool AnnotatedDatumParser::Parse(const void* bytes, size_t size, std::string* why) {
  caffe::AnnotatedDatum& m = impl_->message;
  fields_ = DatumFields{};
  boxes_.clear();
  if (size > static_cast<size_t>(INT32_MAX) || !m.ParseFromArray(bytes, static_cast<int>(size))) {
    *why = "not an AnnotatedDatum record";
    return false;
  }
  if (!m.has_datum()) {
    // A classification Datum's fields land in unknown fields: no image here.
    *why = "not an AnnotatedDatum record (no image; a classification Datum?)";
    return false;
  }
  const caffe::Datum& d = m.datum();
  fields_.channels = d.channels();
  fields_.height = d.height();
  fields_.width = d.width();
  fields_.label = d.label();
  fields_.encoded = d.encoded();
  for (const caffe::AnnotationGroup& g : m.annotation_group()) {
    for (const caffe::Annotation& a : g.annotation()) {
      const caffe::NormalizedBBox& b = a.bbox();
      BoxAnnotation box;
      box.label = g.group_label();
      box.instance_id = a.instance_id();
      box.xmin = b.xmin();
      box.ymin = b.ymin();
      box.xmax = b.xmax();
      box.ymax = b.ymax();
      box.difficult = b.difficult();
      if (!std::isfinite(box.xmin) || !std::isfinite(box.ymin) || !std::isfinite(box.xmax) ||
          !std::isfinite(box.ymax) || box.xmin > box.xmax || box.ymin > box.ymax) {
        *why = StrCat("box [", box.xmin, ", ", box.ymin, ", ", box.xmax, ", ", box.ymax,
                      "] of label ", box.label, " is not a box (xmin <= xmax, ymin <= ymax)");
        boxes_.clear();
        return false;
      }
      boxes_.push_back(box);
    }
  }
  return true;
}

std::string_view AnnotatedDatumParser::data() const { return impl_->message.datum().data(); }

bool AnnotatedDatumParser::RawPixels(ImageU8* out, std::string* why) const {
  const caffe::Datum& d = impl_->message.datum();
  return RawDatumPixels(fields_, d.data(), d.float_data().data(),
                        static_cast<size_t>(d.float_data_size()), out, why);
}

}  // namespace cortado

// Detection data sets in their published layouts, listed for `cortado convert`
// (data/converter.h): every image with its objects in pixel coordinates, before any image is
// read.
//
// Pascal VOC: a root ROOT holds JPEGImages/<id>.jpg, Annotations/<id>.xml and
// ImageSets/Main/<split>.txt (one id per line). Several roots are joined in order, as VOC07+12
// joins VOC2007 and VOC2012 trainval. An item's key is "<root folder name>/JPEGImages/<id>.jpg"
// (Caffe SSD's create_list.sh makes the same paths under VOCdevkit). VOC coordinates are 1-based
// pixel indices with the right and bottom pixels included, so the box of <xmin> 1 <xmax> W covers
// the whole width: in continuous coordinates (0 = the left edge of the image, W = its right edge)
// it is [xmin - 1, xmax]. IoU in continuous coordinates equals the VOC devkit's "+1" pixel IoU.
// (Caffe SSD divides xmin and xmax by the width as they are, which places boxes up to a pixel
// further right and down; records it wrote read as they are.)
//
// COCO: an instances_*.json (images, annotations, categories) and the folder of its images;
// images in id order, keyed by their file_name. bbox [x, y, w, h] is continuous already:
// [x, x + w]. Crowd regions (iscrowd 1) are kept as difficult objects, which VOC-style
// evaluation ignores and COCO's evaluation does not count as misses either. Classes are the
// categories in id order, named by their id as text (Caffe SSD's labelmap_coco.prototxt does
// the same) and displayed by their name. The JSON's "segmentation" values, most of its bytes, are
// dropped while parsing.
//
// An annotation that cannot be used (XML that does not parse, a missing field, a number that is
// not one, xmax < xmin) does not stop the listing: the item carries the reason, and the
// converter skips it and names it in DB/skipped.txt. A missing list file, a root that is not a
// VOC root, or a COCO file that is not COCO JSON throws cortado::Error.
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace cortado {

struct PixelBox {
  std::string name;  // the class as the annotation names it (VOC <name>; COCO: category id)
  double xmin = 0, ymin = 0, xmax = 0, ymax = 0;  // continuous pixel coordinates (see above)
  bool difficult = false;
  int label = 0;  // the class label, 1..K: set by the converter from its label map
};

struct DetectionItem {
  std::string file;           // the image file to read
  std::string key;            // the record key's path part
  std::string source;         // where the objects come from, for messages (the XML file)
  int width = 0, height = 0;  // the image size the annotation states; 0: not stated
  std::vector<PixelBox> boxes;
  std::string error;  // why the annotation is unusable; "" when it is fine
};

struct DetectionSet {
  std::vector<DetectionItem> items;
  // The classes found: VOC's <name>s sorted (the 20 VOC classes come out in the usual order,
  // aeroplane ... tvmonitor); COCO's category ids in order, with their names to display.
  std::vector<std::string> names;
  std::vector<std::string> display_names;
};

// Whether `dir` is laid out as a VOC root (JPEGImages/ and Annotations/ folders).
bool IsVocRoot(const std::string& dir);

// The items of ROOT/ImageSets/Main/<split>.txt for each root, in order. `stop` (may be null) is
// polled between files: when set, throws.
DetectionSet ListVoc(const std::vector<std::string>& roots, const std::string& split,
                     const std::atomic<bool>* stop = nullptr);

// The images of a COCO instances JSON, whose file_names are relative to `image_root`.
DetectionSet ListCoco(const std::string& instances_json, const std::string& image_root);

// The objects (and stated size) of one VOC annotation file's text into *item; false with *why
// when it is malformed.
bool ParseVocAnnotation(const std::string& xml, DetectionItem* item, std::string* why);

}  // namespace cortado

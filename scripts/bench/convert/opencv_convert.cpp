// The image work of Caffe's convert_imageset with --resize_height/--resize_width (or a shorter
// side) and --encoded, as a loop over a list of files: cv::imread as colour (a full-size
// decode), cv::resize with bilinear interpolation, cv::imencode to JPEG at the given quality.
// It writes no database; the records' bytes are only counted. Used by scripts/bench/convert.sh
// as the peer measured in the same run (Caffe itself is not packaged in Debian).
//
//   opencv_convert LIST_FILE (WxH | shorter=N) QUALITY
// Prints one JSON object: images, seconds (wall), cpu_seconds, bytes_out.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

static double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: opencv_convert LIST_FILE (WxH | shorter=N) QUALITY\n");
    return 2;
  }
  std::vector<std::string> files;
  std::ifstream list(argv[1]);
  for (std::string line; std::getline(list, line);) {
    if (!line.empty()) files.push_back(line);
  }
  if (files.empty()) {
    std::fprintf(stderr, "opencv_convert: no files listed in %s\n", argv[1]);
    return 1;
  }
  const std::string size = argv[2];
  int width = 0, height = 0, shorter = 0;
  if (size.rfind("shorter=", 0) == 0) {
    shorter = std::stoi(size.substr(8));
  } else if (std::sscanf(size.c_str(), "%dx%d", &width, &height) != 2) {
    std::fprintf(stderr, "opencv_convert: size '%s' is neither WxH nor shorter=N\n", argv[2]);
    return 2;
  }
  const std::vector<int> params = {cv::IMWRITE_JPEG_QUALITY, std::stoi(argv[3])};
  cv::setNumThreads(1);  // one core, as convert_imageset runs
  const double cpu0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  size_t bytes = 0;
  std::vector<uchar> encoded;
  for (const std::string& path : files) {
    cv::Mat image = cv::imread(path, cv::IMREAD_COLOR);
    if (image.empty()) {
      std::fprintf(stderr, "opencv_convert: cannot decode %s\n", path.c_str());
      return 1;
    }
    int w = width, h = height;
    if (shorter > 0) {
      const bool portrait = image.cols <= image.rows;
      w = portrait ? shorter
                   : static_cast<int>(std::lround(1.0 * image.cols * shorter / image.rows));
      h = portrait ? static_cast<int>(std::lround(1.0 * image.rows * shorter / image.cols))
                   : shorter;
    }
    cv::Mat resized;
    cv::resize(image, resized, cv::Size(w, h), 0, 0, cv::INTER_LINEAR);
    cv::imencode(".jpg", resized, encoded, params);
    bytes += encoded.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"images\":%zu,\"seconds\":%.6f,\"cpu_seconds\":%.6f,\"bytes_out\":%zu}\n",
              files.size(), seconds, CpuSeconds() - cpu0, bytes);
  return 0;
}

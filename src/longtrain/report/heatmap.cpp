// The needle grid's SVG. Non-obvious: the colour scale goes red -> yellow -> green through HSL
// hue 0..120, so that 50% reads as yellow rather than the brown a straight RGB blend gives.
#include "longtrain/report/heatmap.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "longtrain/core/check.h"

namespace lt::report {

namespace {

constexpr int kCellW = 64, kCellH = 32, kLeft = 90, kTop = 48, kBottom = 44, kRight = 16;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string colour(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "hsl(%.0f,70%%,%.0f%%)", 120.0 * std::clamp(v, 0.0, 1.0), 55.0);
  return buf;
}

}  // namespace

std::string heatmapSvg(const Heatmap& h) {
  const int cols = static_cast<int>(h.columns.size()), rows = static_cast<int>(h.rows.size());
  const int width = kLeft + cols * kCellW + kRight, height = kTop + rows * kCellH + kBottom;
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height);
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"20\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n",
                width / 2, escape(h.title).c_str());
  s += buf;
  for (int r = 0; r < rows; ++r) {
    const int y = kTop + r * kCellH;
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", kLeft - 8,
                  y + kCellH / 2 + 4, escape(h.rows[r]).c_str());
    s += buf;
    for (int c = 0; c < cols; ++c) {
      const double v = h.values[r][c];
      const int x = kLeft + c * kCellW;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\"/>"
                    "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%.2f</text>\n",
                    x, y, kCellW, kCellH, colour(v).c_str(), x + kCellW / 2, y + kCellH / 2 + 4, v);
      s += buf;
    }
  }
  for (int c = 0; c < cols; ++c) {
    std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  kLeft + c * kCellW + kCellW / 2, kTop + rows * kCellH + 16, escape(h.columns[c]).c_str());
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                kLeft + cols * kCellW / 2, height - 8, escape(h.xLabel).c_str());
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"14\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 14 %d)\">%s</text>\n",
                kTop + rows * kCellH / 2, kTop + rows * kCellH / 2, escape(h.yLabel).c_str());
  s += buf;
  return s + "</svg>\n";
}

void writeHeatmap(const Heatmap& h, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    LT_CHECK(f.is_open(), "cannot write '", path, "' (does its directory exist?)");
    f << heatmapSvg(h);
    f.close();
    LT_CHECK(f.good(), "writing '", path, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  LT_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace lt::report

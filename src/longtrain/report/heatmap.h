// An accuracy grid as an SVG heatmap (longtrain eval --needle --out grid.svg): columns are the
// lengths, rows the depths, each cell coloured from red (0) through yellow to green (1) with
// its value written in it. Plain SVG text, no library.
#pragma once
#include <string>
#include <vector>

namespace lt::report {

struct Heatmap {
  std::string title, xLabel, yLabel;
  std::vector<std::string> columns, rows;
  std::vector<std::vector<double>> values;  // [row][column], each in [0, 1]
};

std::string heatmapSvg(const Heatmap& h);
// Writes it to `path` (via path.tmp, renamed); lt::Error naming the path if it cannot.
void writeHeatmap(const Heatmap& h, const std::string& path);

}  // namespace lt::report

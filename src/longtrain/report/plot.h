// Training curves of one or more runs as one self-contained SVG (no fonts, scripts or links):
// loss (eval dashed), tokens/s, MFU and peak memory against step. A resumed run's --metrics
// file repeats the steps it re-ran; the later record of a step replaces the earlier one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt::report {

struct MetricPoint {
  int64_t step = 0;
  double value = 0;
};

// One run's curves, each sorted by step. Only finite values from the file are kept; an empty
// series (the field never appeared) draws no curve.
struct RunSeries {
  std::string label;
  std::vector<MetricPoint> loss;
  std::vector<MetricPoint> evalLoss;
  std::vector<MetricPoint> tokensPerS;
  std::vector<MetricPoint> mfuPercent;  // the file's mfu (a fraction) x 100
  std::vector<MetricPoint> peakMib;     // peak_rss_bytes / 2^20
};

struct PlotOptions {
  bool logLoss = false;  // log-scale y for the loss panel (non-positive losses are dropped)
  std::string title;     // drawn above the legend when not empty
  int width = 1200;      // pixels; the height follows from the panels and the legend
};

// Parses a `longtrain train --metrics` JSONL file; the label is the file's stem. Lines without
// "step" (and blank lines) are skipped; a line that is not a JSON object, or a metric that is
// neither a number nor null (how NaN/inf are written), throws lt::Error naming file and line.
RunSeries readMetrics(const std::string& path);

// readMetrics for each path, labelled by `labels` in order when given (one per path), else by
// stem, or parent/stem where two stems are equal.
std::vector<RunSeries> readRuns(const std::vector<std::string>& paths, const std::vector<std::string>& labels = {});

// The SVG document: a 2x2 grid of panels, one colour per run, a legend of the labels. Each
// series is drawn in step order, its non-finite points skipped. Each panel's <g> carries
// data-plot-area="x y w h": the pixel box the data range maps onto exactly.
std::string renderSvg(const std::vector<RunSeries>& runs, const PlotOptions& options = {});

// Writes renderSvg to `outPath` (.svg, or .png through rsvg-convert) via a temporary file
// renamed into place, so a failure leaves no partial file.
void writePlot(const std::vector<RunSeries>& runs, const std::string& outPath, const PlotOptions& options = {});

// The panel titles that no run has data for (for the command's summary line).
std::vector<std::string> emptyPanels(const std::vector<RunSeries>& runs);

// Tick values at 1, 2 or 5 x 10^k spacing inside [lo, hi], about `target` of them (at least
// two when lo < hi).
std::vector<double> niceTicks(double lo, double hi, int target = 5);

}  // namespace lt::report

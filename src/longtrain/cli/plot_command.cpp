// `longtrain plot`: the curves of one or more --metrics files, overlaid in one SVG (or PNG).
// Non-obvious: a panel no run has data for is drawn empty and named in the summary line, so a
// missing curve is reported rather than silently absent.
#include <cstdio>

#include "longtrain/cli/command.h"
#include "longtrain/report/plot.h"

namespace lt::cli {

namespace {

struct PlotFlags {
  std::vector<std::string> files, labels;
  std::string out;
  report::PlotOptions options;
};

int runPlot(const PlotFlags& f) {
  const auto runs = report::readRuns(f.files, f.labels);
  report::writePlot(runs, f.out, f.options);
  std::string empty;
  for (const auto& p : report::emptyPanels(runs)) empty += (empty.empty() ? " (no data: " : ", ") + p;
  std::printf("plot: %zu run%s, 4 panels -> %s%s\n", runs.size(), runs.size() == 1 ? "" : "s", f.out.c_str(),
              empty.empty() ? "" : (empty + ")").c_str());
  return 0;
}

}  // namespace

Command plotCommand(CLI::App& app) {
  auto f = std::make_shared<PlotFlags>();
  auto* plot = app.add_subcommand("plot", "plot loss (and eval loss), tokens/s, MFU and peak memory of one or more "
                                          "runs' --metrics files, overlaid, as one SVG (or PNG)");
  plot->add_option("METRICS", f->files, "JSONL files written by `longtrain train --metrics`")->required();
  plot->add_option("--out", f->out, "the image to write: .svg, or .png (needs rsvg-convert, Debian librsvg2-bin)")
      ->required();
  plot->add_option("--label", f->labels, "legend name of each run, in the files' order (repeat once per file; "
                                         "default: the file names)");
  plot->add_flag("--log-loss", f->options.logLoss, "log-scale y axis for the loss panel");
  plot->add_option("--title", f->options.title, "a title above the legend");
  plot->add_option("--width", f->options.width, "image width in pixels (default 1200)")->check(CLI::Range(400, 10000));
  return {plot, [f] { return runPlot(*f); }};
}

}  // namespace lt::cli

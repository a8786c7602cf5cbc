package report

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is a named list of values.
type Series struct {
	Name   string
	Values []float64
}

// palette gives series distinguishable colours.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}, color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	color.RGBA{R: 0x00, G: 0x00, B: 0x00, A: 0xff},
}

// Convergence is a tuning run, step by step.
type Convergence struct {
	Title string
	// Objective names the tuned metric, e.g. "p95 TTFT (ms)".
	Objective string
	// Start is the initial incumbent's score (NaN if unmeasured).
	Start float64
	// Candidate and Incumbent are each step's candidate score and the
	// incumbent score it was compared with; Accepted marks the winners.
	Candidate, Incumbent []float64
	Accepted             []bool
	// Params are the incumbent's parameters at the start (index 0) and
	// after each step.
	Params []Series
}

// PlotConvergence writes a PNG with the objective per step on top and the
// incumbent's parameters per step below.
func PlotConvergence(path string, c Convergence) error {
	top := plot.New()
	top.Title.Text = c.Title
	top.X.Label.Text = "step"
	top.Y.Label.Text = c.Objective
	var cand, won, inc plotter.XYs
	if !math.IsNaN(c.Start) {
		inc = append(inc, plotter.XY{X: 0, Y: c.Start})
	}
	for i := range c.Candidate {
		x := float64(i + 1)
		if !math.IsInf(c.Candidate[i], 0) && !math.IsNaN(c.Candidate[i]) {
			cand = append(cand, plotter.XY{X: x, Y: c.Candidate[i]})
			if c.Accepted[i] {
				won = append(won, plotter.XY{X: x, Y: c.Candidate[i]})
			}
		}
		best := c.Incumbent[i]
		if c.Accepted[i] {
			best = c.Candidate[i]
		}
		if !math.IsInf(best, 0) && !math.IsNaN(best) {
			inc = append(inc, plotter.XY{X: x, Y: best})
		}
	}
	if len(cand) > 0 {
		s, err := plotter.NewScatter(cand)
		if err != nil {
			return err
		}
		s.GlyphStyle.Color = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
		s.GlyphStyle.Radius = vg.Points(2)
		top.Add(s)
		top.Legend.Add("candidate", s)
	}
	if len(won) > 0 {
		s, err := plotter.NewScatter(won)
		if err != nil {
			return err
		}
		s.GlyphStyle.Color = palette[2]
		s.GlyphStyle.Radius = vg.Points(3.5)
		top.Add(s)
		top.Legend.Add("accepted", s)
	}
	if len(inc) > 0 {
		l, err := plotter.NewLine(inc)
		if err != nil {
			return err
		}
		l.Color = palette[0]
		l.Width = vg.Points(1.5)
		l.StepStyle = plotter.PostStep
		top.Add(l)
		top.Legend.Add("incumbent", l)
	}
	top.Legend.Top = true

	bottom := plot.New()
	bottom.X.Label.Text = "step"
	bottom.Y.Label.Text = "incumbent weight"
	bottom.Y.Min = 0
	for k, p := range c.Params {
		var xy plotter.XYs
		for i, v := range p.Values {
			xy = append(xy, plotter.XY{X: float64(i), Y: v})
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[(k+1)%len(palette)]
		l.Width = vg.Points(1.5)
		l.StepStyle = plotter.PostStep
		bottom.Add(l)
		bottom.Legend.Add(p.Name, l)
	}
	bottom.Legend.Top = true
	return savePanels(path, 8*vg.Inch, 7*vg.Inch, top, bottom)
}

// ErrNothingToPlot means no series had a value to draw (no request
// completed, or none was scored).
var ErrNothingToPlot = errors.New("no request completed: nothing to plot")

// PlotCDF writes a PNG of each series' empirical CDF (values in ms, log x);
// ErrNothingToPlot, writing nothing, where no series has a positive value.
func PlotCDF(path, title, xlabel string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	drawn := 0
	for k, s := range series {
		v := slices.Clone(s.Values)
		slices.Sort(v)
		var xy plotter.XYs
		// At most ~400 points per curve keeps the file small and the line smooth.
		stride := max(1, len(v)/400)
		for i := 0; i < len(v); i += stride {
			if v[i] > 0 {
				xy = append(xy, plotter.XY{X: v[i], Y: float64(i+1) / float64(len(v))})
			}
		}
		if n := len(v); n > 0 && v[n-1] > 0 {
			xy = append(xy, plotter.XY{X: v[n-1], Y: 1})
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[k%len(palette)]
		l.Width = vg.Points(1.5)
		if k >= len(palette) {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(s.Name, l)
		drawn++
	}
	if drawn == 0 {
		// A log axis over no value panics in gonum/plot.
		return ErrNothingToPlot
	}
	p.Legend.Left = false
	p.Legend.Top = false
	p.Legend.XOffs = -vg.Points(4)
	p.Legend.YOffs = vg.Points(40)
	return savePanels(path, 8*vg.Inch, 5.5*vg.Inch, p)
}

// savePanels draws plots stacked vertically into one PNG.
func savePanels(path string, w, h vg.Length, plots ...*plot.Plot) error {
	grid := make([][]*plot.Plot, len(plots))
	for i, p := range plots {
		grid[i] = []*plot.Plot{p}
	}
	return saveGrid(path, w, h, grid)
}

// saveGrid draws a row-major grid of plots (nil leaves a tile empty)
// into one PNG.
func saveGrid(path string, w, h vg.Length, grid [][]*plot.Plot) error {
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(grid), Cols: len(grid[0]), PadX: vg.Points(8), PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align(grid, tiles, dc)
	for i, row := range grid {
		for j, p := range row {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing plot %s: %w", path, err)
	}
	return f.Close()
}

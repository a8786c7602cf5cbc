package report

import (
	"cmp"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Tails are one policy's p95 TTFT and p95 E2E (ms) in one cell of a
// grid of runs.
type Tails struct {
	Policy    string
	TTFT, E2E float64
	// Yardstick marks a policy no router can be (clairvoyant): drawn,
	// never on the front, and not among the bests the margins are drawn
	// from for TTFT.
	Yardstick bool
}

// A Cell is one workload, fleet and load: its policies' tails.
type Cell struct {
	Title string
	Runs  []Tails
}

// Front returns the runs no other non-yardstick run beats on both tails
// (strictly lower p95 TTFT and p95 E2E), by TTFT: the policies' TTFT–E2E
// front, yardsticks left out, as scripts/grid's "on the front" reads it.
func Front(runs []Tails) []Tails {
	var front []Tails
	for _, r := range runs {
		if r.Yardstick {
			continue
		}
		dominated := slices.ContainsFunc(runs, func(o Tails) bool {
			return !o.Yardstick && o.TTFT < r.TTFT && o.E2E < r.E2E
		})
		if !dominated {
			front = append(front, r)
		}
	}
	slices.SortFunc(front, func(a, b Tails) int { return cmp.Or(cmp.Compare(a.TTFT, b.TTFT), cmp.Compare(b.E2E, a.E2E)) })
	return front
}

// PlotFronts writes a PNG of cells, cols panels to a row: in each, every
// policy's p95 TTFT against its p95 E2E (a colour per policy, the same in
// every panel; the yardsticks black rings), the front as a line, and
// grey dashed lines at 3% above the best non-yardstick p95 TTFT and the best
// p95 E2E: a policy inside that corner has both tails within 3% of the
// bests. The policy named mark is drawn larger. A panel's view holds the
// front, the marked policy, the yardsticks and the corner; policies far
// behind them are left out of it and counted in its title. The legend,
// titled title, takes a tile at the end of the first row.
func PlotFronts(path, title string, cols int, mark string, cells []Cell) error {
	var names []string // every policy
	yardsticks := map[string]bool{}
	for _, c := range cells {
		for _, r := range c.Runs {
			if !slices.Contains(names, r.Policy) {
				names = append(names, r.Policy)
			}
			yardsticks[r.Policy] = yardsticks[r.Policy] || r.Yardstick
		}
	}
	// Alphabetical, the yardsticks last: a policy keeps its colour in
	// every figure of the same policies.
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(yardstickOrder(yardsticks[a]), yardstickOrder(yardsticks[b])), cmp.Compare(a, b))
	})
	if len(cells) == 0 || cols < 1 {
		return fmt.Errorf("plotting fronts: %d cells in rows of %d", len(cells), cols)
	}
	// A row of cols panels, then the legend's tile at the first row's end.
	rows := (len(cells) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols+1)
	}
	for i, c := range cells {
		p, err := frontPanel(c, names, mark)
		if err != nil {
			return err
		}
		grid[i/cols][i%cols] = p
	}
	legend, err := legendPanel(names, yardsticks, mark)
	if err != nil {
		return err
	}
	legend.Title.Text = title
	grid[0][cols] = legend
	return saveGrid(path, vg.Length(cols+1)*3.6*vg.Inch, vg.Length(rows)*3.4*vg.Inch, grid)
}

// A panelView is what a panel shows: the bests, the axes' ranges and the
// runs within them.
type panelView struct {
	bestT, bestE           float64 // the best non-yardstick p95 TTFT, the best p95 E2E
	minT, maxT, minE, maxE float64
	shown                  []Tails
}

// view is the panel's view of c: the front, the marked policy, the
// yardsticks and the bests' 3% corner, with a margin; policies far behind
// them all are left out (or they would squeeze the front into a corner).
// ok is false when the cell has no run that is not a yardstick.
func view(c Cell, mark string) (v panelView, ok bool) {
	v.bestT, v.bestE = math.Inf(1), math.Inf(1)
	for _, r := range c.Runs {
		if !r.Yardstick {
			v.bestT = min(v.bestT, r.TTFT)
		}
		v.bestE = min(v.bestE, r.E2E)
	}
	if math.IsInf(v.bestT, 1) {
		return v, false
	}
	front := Front(c.Runs)
	v.minT, v.maxT, v.minE, v.maxE = v.bestT, 1.03*v.bestT, v.bestE, 1.03*v.bestE
	for _, r := range c.Runs {
		if r.Yardstick || r.Policy == mark || slices.Contains(front, r) {
			v.minT, v.maxT = min(v.minT, r.TTFT), max(v.maxT, r.TTFT)
			v.minE, v.maxE = min(v.minE, r.E2E), max(v.maxE, r.E2E)
		}
	}
	v.maxT += 0.25 * max(v.maxT-v.minT, 0.1*v.maxT)
	v.maxE += 0.25 * max(v.maxE-v.minE, 0.1*v.maxE)
	for _, r := range c.Runs {
		if r.TTFT <= v.maxT && r.E2E <= v.maxE {
			v.shown = append(v.shown, r)
		}
	}
	return v, true
}

func frontPanel(c Cell, names []string, mark string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = vg.Points(10)
	p.X.Label.Text = "p95 TTFT (ms)"
	p.Y.Label.Text = "p95 E2E (ms)"
	p.X.Tick.Marker, p.Y.Tick.Marker = wholeTicks, wholeTicks
	v, ok := view(c, mark)
	if !ok {
		return p, nil
	}
	if n := len(c.Runs) - len(v.shown); n > 0 {
		p.Title.Text += fmt.Sprintf(" (%d beyond the view)", n)
	}
	p.X.Min, p.X.Max = v.minT-0.06*(v.maxT-v.minT), v.maxT
	p.Y.Min, p.Y.Max = v.minE-0.06*(v.maxE-v.minE), v.maxE
	front := Front(c.Runs)
	var line plotter.XYs
	for _, r := range front {
		line = append(line, plotter.XY{X: r.TTFT, Y: r.E2E})
	}
	if len(line) > 1 {
		l, err := plotter.NewLine(line)
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 0x60}
		l.Width = vg.Points(1)
		p.Add(l)
	}
	// The 3% corner: the margins' lines, drawn from the plot's lower
	// edges to the corner.
	corner := plotter.XY{X: 1.03 * v.bestT, Y: 1.03 * v.bestE}
	for _, seg := range []plotter.XYs{
		{{X: corner.X, Y: p.Y.Min}, corner},
		{{X: p.X.Min, Y: corner.Y}, corner},
	} {
		l, err := plotter.NewLine(seg)
		if err != nil {
			return nil, err
		}
		l.Color = color.Gray{Y: 0x40}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
		p.Add(l)
	}
	// The marked policy first, so that a point under its larger glyph
	// still shows.
	runs := v.shown
	marked := func(r Tails) int {
		if r.Policy == mark {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(runs, func(a, b Tails) int { return cmp.Compare(marked(a), marked(b)) })
	for _, r := range runs {
		s, err := plotter.NewScatter(plotter.XYs{{X: r.TTFT, Y: r.E2E}})
		if err != nil {
			return nil, err
		}
		s.GlyphStyle = glyph(slices.Index(names, r.Policy), r.Yardstick, r.Policy == mark)
		p.Add(s)
	}
	return p, nil
}

// legendPanel is a panel of the policies' glyphs alone, as frontPanel
// draws them.
func legendPanel(names []string, yardsticks map[string]bool, mark string) (*plot.Plot, error) {
	p := plot.New()
	p.HideAxes()
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	for k, name := range names {
		s, err := plotter.NewScatter(plotter.XYs{{}})
		if err != nil {
			return nil, err
		}
		s.GlyphStyle = glyph(k, yardsticks[name], name == mark)
		p.Legend.Add(name, s)
	}
	return p, nil
}

func yardstickOrder(y bool) int {
	if y {
		return 1
	}
	return 0
}

// wholeTicks are gonum's default ticks labelled in whole milliseconds.
var wholeTicks = plot.TickerFunc(func(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', 0, 64)
		}
	}
	return ticks
})

// glyph is the k-th policy's marker: a colour of the palette (then the
// palette again in squares and triangles), yardsticks a black ring, the
// marked policy larger.
func glyph(k int, yardstick, marked bool) draw.GlyphStyle {
	g := draw.GlyphStyle{
		Color:  palette[k%len(palette)],
		Radius: vg.Points(3),
		Shape:  []draw.GlyphDrawer{draw.CircleGlyph{}, draw.SquareGlyph{}, draw.TriangleGlyph{}}[k/len(palette)%3],
	}
	if yardstick {
		g.Shape, g.Color = draw.RingGlyph{}, color.Black
	}
	if marked {
		g.Radius = vg.Points(5.5)
	}
	return g
}

// Command cost prices a synthesized CloudFormation template of the stack
// (cdk synth output, scripts/synth.sh) with the price table kept beside it
// (prices.json: each price with its source and date, the usage assumed for
// what is billed by use, and the resource types that cost nothing, each
// with its reason). It prints the monthly cost per item for each stage it
// is given, and fills or checks the cost table in docs/deployment.md, so a
// change that adds cost shows up in review:
//
//	go run ./scripts/cost -template dev=infra/cdk.out/StripeInbox-dev.template.json \
//	    -template prod=infra/cdk.out.prod/StripeInbox-prod.template.json -check docs/deployment.md
//
// A resource type that is neither priced here nor listed as free fails the
// run: every AWS resource has a price and a reason.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Prices is prices.json.
type Prices struct {
	Region        string           `json:"region"`
	HoursPerMonth float64          `json:"hours_per_month"`
	Prices        map[string]Price `json:"prices"`
	Usage         struct {
		SearchMetrics     Count                  `json:"search_metrics"`
		LogsGBMonth       Count                  `json:"logs_gb_month"`
		TrailEventsMonth  Count                  `json:"cloudtrail_data_events_month"`
		OutboxEventsMonth Count                  `json:"outbox_events_month"`
		Lambda            map[string]LambdaUsage `json:"lambda"`
	} `json:"usage"`
	Free map[string]string `json:"free"`
}

// Price is one list price, or a price per instance class (By).
type Price struct {
	USD    float64            `json:"usd"`
	By     map[string]float64 `json:"by"`
	Unit   string             `json:"unit"`
	Source string             `json:"source"`
	Date   string             `json:"date"`
}

// Count is an assumed quantity and why.
type Count struct {
	Count float64 `json:"count"`
	Why   string  `json:"why"`
}

// LambdaUsage is a function's assumed invocations a month and seconds each.
type LambdaUsage struct {
	Invocations float64 `json:"invocations"`
	Seconds     float64 `json:"seconds"`
	Why         string  `json:"why"`
}

// Item is one line of the bill.
type Item struct {
	Name string
	USD  float64
}

// Bill is a stage's items and total.
type Bill struct {
	Stage string
	Items []Item
}

// Total is the sum of the items, in cents as printed.
func (b Bill) Total() float64 {
	t := 0.0
	for _, it := range b.Items {
		t += round(it.USD)
	}
	return round(t)
}

func round(v float64) float64 { return math.Round(v*100) / 100 }

type resource struct {
	Type       string         `json:"Type"`
	Properties map[string]any `json:"Properties"`
}

type template struct {
	Resources map[string]resource `json:"Resources"`
}

// price looks up a named price; a missing one is a mistake in prices.json.
func (p Prices) price(name string) (Price, error) {
	pr, ok := p.Prices[name]
	if !ok || pr.Source == "" || pr.Date == "" {
		return Price{}, fmt.Errorf("prices.json: price %q missing, or without source and date", name)
	}
	return pr, nil
}

// Compute prices one template.
func Compute(stage string, t template, p Prices) (Bill, error) {
	b := Bill{Stage: stage}
	var errs []error
	must := func(name string) Price {
		pr, err := p.price(name)
		errs = append(errs, err)
		return pr
	}
	// Items of one name add up (CDK's two provider functions), and a name
	// says what it prices, not how many: the columns of two stages line up.
	add := func(name string, usd float64) {
		for i := range b.Items {
			if b.Items[i].Name == name {
				b.Items[i].USD += usd
				return
			}
		}
		b.Items = append(b.Items, Item{name, usd})
	}
	h := p.HoursPerMonth

	ids := make([]string, 0, len(t.Resources))
	for id := range t.Resources {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	byType := map[string][]string{}
	for _, id := range ids {
		byType[t.Resources[id].Type] = append(byType[t.Resources[id].Type], id)
	}
	priced := map[string]bool{}
	handled := func(types ...string) {
		for _, ty := range types {
			priced[ty] = true
		}
	}

	// RDS: the instance, its storage, the proxy billed by the instance's vCPUs.
	vcpus := 0.0
	for _, id := range byType["AWS::RDS::DBInstance"] {
		props := t.Resources[id].Properties
		class, _ := props["DBInstanceClass"].(string)
		perHour, ok := must("rds_instance_hour").By[class]
		if !ok {
			errs = append(errs, fmt.Errorf("prices.json: no rds_instance_hour for %s", class))
		}
		vcpus = must("rds_instance_vcpus").By[class]
		copies := 1.0
		if props["MultiAZ"] == true {
			copies = 2
		}
		add(fmt.Sprintf("RDS %s ($%g/h; Multi-AZ twice)", class, perHour), perHour*h*copies)
		gib, _ := strconv.ParseFloat(fmt.Sprint(props["AllocatedStorage"]), 64)
		add(fmt.Sprintf("RDS storage %g GiB %v (Multi-AZ twice)", gib, props["StorageType"]), gib*must("rds_gp3_gib_month").USD*copies)
	}
	handled("AWS::RDS::DBInstance")
	for range byType["AWS::RDS::DBProxy"] {
		add(fmt.Sprintf("RDS Proxy (%g vCPU of the instance, 2 minimum)", math.Max(vcpus, 2)), math.Max(vcpus, 2)*must("rds_proxy_vcpu_hour").USD*h)
	}
	handled("AWS::RDS::DBProxy")

	if n := len(byType["AWS::SecretsManager::Secret"]); n > 0 {
		add("Secrets Manager secrets ($0.40 each)", float64(n)*must("secret_month").USD)
	}
	handled("AWS::SecretsManager::Secret")

	for _, id := range byType["AWS::EC2::VPCEndpoint"] {
		props := t.Resources[id].Properties
		if props["VpcEndpointType"] != "Interface" {
			errs = append(errs, fmt.Errorf("%s: a %v VPC endpoint is not priced", id, props["VpcEndpointType"]))
			continue
		}
		azs := float64(len(asSlice(props["SubnetIds"])))
		add(fmt.Sprintf("Interface endpoint %s (%g AZs)", id, azs), azs*must("interface_endpoint_az_hour").USD*h)
	}
	handled("AWS::EC2::VPCEndpoint")
	if n := len(byType["AWS::EC2::NatGateway"]); n > 0 {
		add(fmt.Sprintf("NAT gateways (%d)", n), float64(n)*must("nat_gateway_hour").USD*h)
	}
	handled("AWS::EC2::NatGateway")

	// CloudWatch: alarm metrics, the dashboard, the custom metrics the
	// template names.
	alarmMetrics := 0
	for _, id := range byType["AWS::CloudWatch::Alarm"] {
		props := t.Resources[id].Properties
		if ms := asSlice(props["Metrics"]); len(ms) > 0 {
			for _, m := range ms {
				if _, ok := m.(map[string]any)["MetricStat"]; ok {
					alarmMetrics++
				}
			}
		} else {
			alarmMetrics++
		}
	}
	if alarmMetrics > 0 {
		add("CloudWatch alarms ($0.10 per alarm metric)", float64(alarmMetrics)*must("alarm_metric_month").USD)
	}
	handled("AWS::CloudWatch::Alarm")
	if n := len(byType["AWS::CloudWatch::Dashboard"]); n > 0 {
		add("CloudWatch dashboard", float64(n)*must("dashboard_month").USD)
	}
	handled("AWS::CloudWatch::Dashboard")
	// Custom metrics: what the functions publish (METRICS_PUBLISH: each
	// name once, with the base dimensions), or, in a template whose
	// functions publish everything, what its alarms and dashboard name.
	n, declared := publishedMetrics(t)
	if !declared {
		named, searches := customMetrics(t)
		n = float64(len(named)) + float64(searches)*p.Usage.SearchMetrics.Count
	}
	if n > 0 {
		add("CloudWatch custom metrics ($0.30 each)", n*must("custom_metric_month").USD)
	}
	if p.Usage.LogsGBMonth.Count > 0 {
		add(fmt.Sprintf("CloudWatch Logs (%g GB a month)", p.Usage.LogsGBMonth.Count), p.Usage.LogsGBMonth.Count*must("logs_ingest_gb").USD)
	}

	// Lambda: each function's assumed use at its memory size.
	gbs, req := must("lambda_arm_gb_second").USD, must("lambda_request").USD
	for _, id := range byType["AWS::Lambda::Function"] {
		props := t.Resources[id].Properties
		name := functionName(id)
		use := name
		if name == "worker" && residentWorker(props) {
			use = "worker_resident"
		}
		u, ok := p.Usage.Lambda[use]
		if !ok {
			errs = append(errs, fmt.Errorf("prices.json: no lambda usage for %q (%s)", use, id))
			continue
		}
		mem := 128.0
		if m, ok := props["MemorySize"].(float64); ok {
			mem = m
		}
		add(fmt.Sprintf("Lambda %s (%g × %gs a month)", use, u.Invocations, u.Seconds), u.Invocations*(u.Seconds*mem/1024*gbs+req))
	}
	handled("AWS::Lambda::Function")

	if len(byType["AWS::CloudTrail::Trail"]) > 0 {
		add(fmt.Sprintf("CloudTrail data events (%g a month)", p.Usage.TrailEventsMonth.Count), p.Usage.TrailEventsMonth.Count*must("cloudtrail_data_event").USD)
	}
	if len(byType["AWS::Events::EventBus"]) > 0 {
		add(fmt.Sprintf("EventBridge outbox events (%g a month)", p.Usage.OutboxEventsMonth.Count), p.Usage.OutboxEventsMonth.Count*must("eventbridge_custom_event").USD)
	}

	for ty, list := range byType {
		if priced[ty] {
			continue
		}
		if reason := p.Free[ty]; reason == "" {
			errs = append(errs, fmt.Errorf("%s (%s): no price in scripts/cost and not listed as free with a reason in prices.json", ty, list[0]))
		}
	}
	sort.SliceStable(b.Items, func(i, j int) bool { return b.Items[i].USD > b.Items[j].USD })
	return b, errors.Join(errs...)
}

// publishedMetrics counts the metrics the functions' METRICS_PUBLISH lists
// ("none": none); declared is false when no function sets it.
func publishedMetrics(t template) (float64, bool) {
	n, declared := 0.0, false
	for _, r := range t.Resources {
		if r.Type != "AWS::Lambda::Function" {
			continue
		}
		env, _ := r.Properties["Environment"].(map[string]any)
		vars, _ := env["Variables"].(map[string]any)
		v, ok := vars["METRICS_PUBLISH"].(string)
		if !ok {
			continue
		}
		declared = true
		if v != "none" && v != "" {
			n += float64(len(strings.Split(v, ",")))
		}
	}
	return n, declared
}

// residentWorker: the worker's POLL_INTERVAL is set and not zero.
func residentWorker(props map[string]any) bool {
	env, _ := props["Environment"].(map[string]any)
	vars, _ := env["Variables"].(map[string]any)
	v, _ := vars["POLL_INTERVAL"].(string)
	return v != "" && v != "0" && v != "0s"
}

var functionID = regexp.MustCompile(`^([A-Z][a-z]+)Function[0-9A-F]{8}$`)

// functionName is the project's name of a function from its logical id
// (WorkerFunctionACE6A4B0: worker); CDK's own providers are cdk-provider.
func functionName(id string) string {
	if m := functionID.FindStringSubmatch(id); m != nil {
		return strings.ToLower(m[1])
	}
	return "cdk-provider"
}

var dashboardMetric = regexp.MustCompile(`\["([^"\[\]]+)","([A-Za-z0-9_]+)",((?:"[^"]*",?)*)`)

// customMetrics are the distinct custom-namespace metrics (name and
// dimensions) the alarms and the dashboard name, and the number of SEARCH
// expressions (each stands for metrics with dimension values not known at
// synth).
func customMetrics(t template) (map[string]bool, int) {
	named := map[string]bool{}
	searches := 0
	for _, r := range t.Resources {
		switch r.Type {
		case "AWS::CloudWatch::Alarm":
			for _, m := range asSlice(r.Properties["Metrics"]) {
				stat, _ := m.(map[string]any)["MetricStat"].(map[string]any)
				metric, _ := stat["Metric"].(map[string]any)
				if ns, _ := metric["Namespace"].(string); ns != "" && !strings.HasPrefix(ns, "AWS/") {
					dims, _ := json.Marshal(metric["Dimensions"])
					named[metric["MetricName"].(string)+string(dims)] = true
				}
			}
		case "AWS::CloudWatch::Dashboard":
			body := flatten(r.Properties["DashboardBody"])
			searches += strings.Count(body, "SEARCH(")
			for _, m := range dashboardMetric.FindAllStringSubmatch(body, -1) {
				if strings.HasPrefix(m[1], "AWS/") {
					continue
				}
				named[m[2]+dimsOf(m[3])] = true
			}
		}
	}
	// An alarm's and the dashboard's spelling of the same metric differ:
	// key both by name and sorted dimension pairs.
	out := map[string]bool{}
	for k := range named {
		out[canonical(k)] = true
	}
	return out, searches
}

var quoted = regexp.MustCompile(`"([^"]*)"`)

// dimsOf turns the dashboard's "Service","worker","Stage","dev" into the
// alarm's form.
func dimsOf(s string) string {
	var vals []string
	for _, m := range quoted.FindAllStringSubmatch(s, -1) {
		vals = append(vals, m[1])
	}
	var dims []map[string]string
	for i := 0; i+1 < len(vals); i += 2 {
		dims = append(dims, map[string]string{"Name": vals[i], "Value": vals[i+1]})
	}
	b, _ := json.Marshal(dims)
	return string(b)
}

func canonical(key string) string {
	i := strings.Index(key, "[")
	if i < 0 {
		return key
	}
	var dims []map[string]any
	if err := json.Unmarshal([]byte(key[i:]), &dims); err != nil {
		return key
	}
	pairs := make([]string, 0, len(dims))
	for _, d := range dims {
		pairs = append(pairs, fmt.Sprint(d["Name"], "=", d["Value"]))
	}
	slices.Sort(pairs)
	return key[:i] + "{" + strings.Join(pairs, ",") + "}"
}

// flatten joins an Fn::Join body's literal parts (tokens become "?").
func flatten(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		if j, ok := x["Fn::Join"].([]any); ok && len(j) == 2 {
			var sb strings.Builder
			for _, part := range asSlice(j[1]) {
				sb.WriteString(flatten(part))
			}
			return sb.String()
		}
		return "?"
	}
	return ""
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// Table renders the bills side by side as the Markdown table of
// docs/deployment.md.
func Table(bills []Bill) string {
	var sb strings.Builder
	sb.WriteString("| Item |")
	for _, b := range bills {
		sb.WriteString(" " + b.Stage + " |")
	}
	sb.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(bills)) + "\n")
	var names []string
	seen := map[string]bool{}
	for _, b := range bills {
		for _, it := range b.Items {
			if !seen[it.Name] {
				seen[it.Name] = true
				names = append(names, it.Name)
			}
		}
	}
	for _, n := range names {
		sb.WriteString("| " + n + " |")
		for _, b := range bills {
			cell := "—"
			for _, it := range b.Items {
				if it.Name == n {
					cell = fmt.Sprintf("$%.2f", round(it.USD))
				}
			}
			sb.WriteString(" " + cell + " |")
		}
		sb.WriteString("\n")
	}
	sb.WriteString("| **Total** |")
	for _, b := range bills {
		sb.WriteString(fmt.Sprintf(" **$%.2f** |", b.Total()))
	}
	sb.WriteString("\n")
	return sb.String()
}

// The table sits between these markers in docs/deployment.md.
const (
	beginMarker = "<!-- cost table: scripts/cost fills it; do not edit by hand -->\n"
	endMarker   = "<!-- end of cost table -->\n"
)

// Splice puts table between the markers of doc.
func Splice(doc, table string) (string, error) {
	i := strings.Index(doc, beginMarker)
	j := strings.Index(doc, endMarker)
	if i < 0 || j < i {
		return "", errors.New("the cost table's markers are missing: " + strings.TrimSpace(beginMarker) + " … " + strings.TrimSpace(endMarker))
	}
	return doc[:i+len(beginMarker)] + table + doc[j:], nil
}

type templates []string

func (t *templates) String() string     { return strings.Join(*t, ",") }
func (t *templates) Set(v string) error { *t = append(*t, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cost:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("cost", flag.ContinueOnError)
	var tpls templates
	fs.Var(&tpls, "template", "stage=path of a synthesized template (repeat: one column each)")
	pricesPath := fs.String("prices", "scripts/cost/prices.json", "the price table")
	check := fs.String("check", "", "fail unless this Markdown file's cost table is the one computed")
	write := fs.String("write", "", "write the computed cost table into this Markdown file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(tpls) == 0 {
		return errors.New("give at least one -template stage=path (scripts/cost.sh synthesizes dev and prod)")
	}
	raw, err := os.ReadFile(*pricesPath)
	if err != nil {
		return err
	}
	var p Prices
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("%s: %w", *pricesPath, err)
	}
	var bills []Bill
	for _, spec := range tpls {
		stage, path, ok := strings.Cut(spec, "=")
		if !ok {
			return fmt.Errorf("-template %q: want stage=path", spec)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var t template
		if err := json.Unmarshal(raw, &t); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		b, err := Compute(stage, t, p)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		bills = append(bills, b)
	}
	table := Table(bills)
	fmt.Fprint(out, table)
	for _, path := range []string{*check, *write} {
		if path == "" {
			continue
		}
		doc, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		updated, err := Splice(string(doc), table)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if path == *write {
			if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
				return err
			}
			continue
		}
		if updated != string(doc) {
			return fmt.Errorf("%s: the cost table differs from the synthesized templates' cost; run scripts/cost.sh -write and review the change", path)
		}
	}
	return nil
}

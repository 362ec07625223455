package stack

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNoInterfaceEndpointOrNATAndEveryAWSCallerLeavesOverIPv6: the default
// stage has no interface endpoint and no NAT gateway; its VPC is dual-stack
// with an egress-only internet gateway, every subnet the functions use
// routes ::/0 to it, and every function in the VPC that calls AWS allows
// outbound IPv6 (Ipv6AllowedForDualStack) in dual-stack subnets. A function
// that calls nothing (the purge) gets none of it.
func TestNoInterfaceEndpointOrNATAndEveryAWSCallerLeavesOverIPv6(t *testing.T) {
	t.Parallel()
	for _, s := range []*synthesized{dev, prod, retired, live} {
		stage := s.settings.Stage
		require.Empty(t, s.resources("AWS::EC2::VPCEndpoint"), stage)
		require.Empty(t, s.resources("AWS::EC2::NatGateway"), stage)
		require.Empty(t, s.resources("AWS::EC2::InternetGateway"), stage)
		require.Len(t, s.resources("AWS::EC2::VPCCidrBlock"), 1, "%s: an Amazon-provided IPv6 block", stage)
		for _, c := range s.resources("AWS::EC2::VPCCidrBlock") {
			require.Equal(t, true, props(c)["AmazonProvidedIpv6CidrBlock"], stage)
		}
		eigws := s.resources("AWS::EC2::EgressOnlyInternetGateway")
		require.Len(t, eigws, 1, stage)
		var eigwID string
		for id := range eigws {
			eigwID = id
		}

		// Every route table of the stack's subnets sends ::/0 to the
		// egress-only gateway, and nothing sends 0.0.0.0/0 anywhere.
		routed := map[string]bool{}
		for id, r := range s.resources("AWS::EC2::Route") {
			p := props(r)
			require.NotEqual(t, "0.0.0.0/0", p["DestinationCidrBlock"], "%s %s: an IPv4 default route", stage, id)
			if p["DestinationIpv6CidrBlock"] == "::/0" {
				require.Equal(t, map[string]any{"Ref": eigwID}, p["EgressOnlyInternetGatewayId"], id)
				routed[asJSON(t, p["RouteTableId"])] = true
			}
		}
		subnets := s.resources("AWS::EC2::Subnet")
		require.Len(t, subnets, 2, stage)
		tableOf := map[string]string{} // subnet Ref → route table Ref
		for _, a := range s.resources("AWS::EC2::SubnetRouteTableAssociation") {
			p := props(a)
			tableOf[asJSON(t, p["SubnetId"])] = asJSON(t, p["RouteTableId"])
		}
		for id, sn := range subnets {
			p := props(sn)
			require.NotNil(t, p["Ipv6CidrBlock"], "%s %s: dual-stack", stage, id)
			require.Equal(t, true, p["AssignIpv6AddressOnCreation"], id)
			require.True(t, routed[tableOf[asJSON(t, map[string]any{"Ref": id})]], "%s %s: no ::/0 route to the egress-only gateway", stage, id)
		}

		callers := map[string]bool{"webhook": true, "worker": s.settings.OutboxRelay, "migrate": true, "ops": true, "reconcilestore": true, "purge": false}
		for name, fn := range s.appFunctions(t) {
			vpc, inVPC := props(fn)["VpcConfig"].(map[string]any)
			if name == "reconcile" {
				require.False(t, inVPC, "the reconciler runs outside the VPC")
				continue
			}
			require.True(t, inVPC, name)
			want, known := callers[name]
			require.True(t, known, "%s: say whether it calls AWS", name)
			if want {
				require.Equal(t, true, vpc["Ipv6AllowedForDualStack"], "%s %s calls AWS and must leave over IPv6", stage, name)
			} else {
				require.NotEqual(t, true, vpc["Ipv6AllowedForDualStack"], "%s %s calls no AWS API", stage, name)
			}
		}
	}
	// nat=true keeps its NAT gateway (and the IPv6 route beside it).
	require.Len(t, natDev.resources("AWS::EC2::NatGateway"), 1)
	require.Len(t, natDev.resources("AWS::EC2::EgressOnlyInternetGateway"), 1)
}

// TestUpgradeModifiesTheSubnets: an existing stage's VPC, subnets, route
// tables and associations keep their logical ids, and each keeps every
// property whose change would replace it (the VPC's CIDR; a subnet's IPv4
// CIDR, AZ and VPC): the subnets only gain Ipv6CidrBlock and
// AssignIpv6AddressOnCreation, which CloudFormation updates in place. The
// before picture is the template of the release before this one
// (testdata/network-before-issue25.json, from its dev and natdev stacks).
func TestUpgradeModifiesTheSubnets(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("testdata/network-before-issue25.json")
	require.NoError(t, err)
	var before map[string]map[string]resource
	require.NoError(t, json.Unmarshal(raw, &before))
	added := []string{"AssignIpv6AddressOnCreation", "Ipv6CidrBlock"}
	for stage, s := range map[string]*synthesized{"dev": dev, "natdev": natDev} {
		now := s.template["Resources"].(map[string]any)
		for id, old := range before[stage] {
			cur, ok := now[id].(map[string]any)
			require.True(t, ok, "%s: %s (%s) is gone: CloudFormation would replace it", stage, id, old["Type"])
			require.Equal(t, old["Type"], cur["Type"], id)
			oldP, curP := props(old), props(cur)
			for k, v := range oldP {
				if k == "Tags" {
					continue
				}
				require.Equal(t, asJSON(t, v), asJSON(t, curP[k]), "%s: %s.%s changed", stage, id, k)
			}
			for k := range curP {
				if _, had := oldP[k]; !had {
					require.True(t, old["Type"] == "AWS::EC2::Subnet" && slices.Contains(added, k), "%s: %s gained %s", stage, id, k)
				}
			}
			if old["Type"] == "AWS::EC2::Subnet" {
				require.Contains(t, asJSON(t, curP["Ipv6CidrBlock"]), "Ipv6CidrBlocks", "%s: %s takes its /64 from the VPC's new block", stage, id)
			}
		}
		require.False(t, strings.Contains(asJSON(t, now), `"AWS::EC2::VPCEndpoint"`), stage)
	}
}

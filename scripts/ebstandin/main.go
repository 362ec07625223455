// Command ebstandin runs the EventBridge PutEvents stand-in
// (internal/eventbridgetest) as a process of its own, for the fault suite
// (scripts/chaos.sh): it prints "listening on URL" and serves until killed.
// Point the relay at it with AWS_ENDPOINT_URL_EVENTBRIDGE=URL (plus
// AWS_REGION and static credentials); GET URL/_standin/published lists the
// details it accepted (scripts/stripesim -eventbridge URL checks them).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stripe-inbox/inbox/internal/eventbridgetest"
)

func main() {
	s := eventbridgetest.NewServer(os.Args[1:]...) // the buses that exist; none: any
	defer s.Close()
	fmt.Printf("listening on %s\n", s.URL)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
}

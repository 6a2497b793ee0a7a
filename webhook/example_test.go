package webhook_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

// A Slack request from Slack's own documentation verifies with its
// signing secret (the clock is set to the request's time, as a server
// receiving it then would read it); the same request a minute and a
// second too late, or with one byte changed, does not.
func ExampleVerifier_Verify() {
	v, err := webhook.New(webhook.Slack, []string{"8f742231b10e8888abcd99yyyzzz85a5"},
		webhook.WithClock(func() time.Time { return time.Unix(1531420618, 0) }))
	if err != nil {
		fmt.Println(err)
		return
	}
	h := http.Header{}
	h.Set("X-Slack-Request-Timestamp", "1531420618")
	h.Set("X-Slack-Signature", "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503")
	body := "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"

	d, err := v.Verify(h, []byte(body))
	fmt.Println(d.Scheme, d.Timestamp.Format(time.RFC3339), err)

	_, err = v.Verify(h, []byte(strings.Replace(body, "foobar", "foobaz", 1)))
	fmt.Println(errors.Is(err, webhook.ErrInvalid))

	late, _ := webhook.New(webhook.Slack, []string{"8f742231b10e8888abcd99yyyzzz85a5"},
		webhook.WithClock(func() time.Time { return time.Unix(1531420618+301, 0) }))
	_, err = late.Verify(h, []byte(body))
	fmt.Println(err)
	// Output:
	// slack 2018-07-12T18:36:58Z <nil>
	// true
	// replay: signature expired: timestamped 301s before the server's time; the window is 5m0s
}

// A service that sends Standard Webhooks signs each delivery; a redelivery
// keeps its ID and is signed again when it is sent.
func ExampleSigner() {
	signer, err := webhook.NewSigner([]string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		fmt.Println(err)
		return
	}
	sig, err := signer.Sign("msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	fmt.Println(sig, err)
	// Output:
	// v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= <nil>
}

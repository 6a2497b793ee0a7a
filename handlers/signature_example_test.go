package handlers_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
)

// exampleKeys is the client keys file of the examples; a real one is read
// with replay.NewKeyRing(os.Getenv("REPLAYGUARD_CLIENT_KEYS")).
const exampleKeys = `{"keys": [{"id": "partner-1", "alg": "hmac-sha256",
  "secret": "ZXhhbXBsZSBvbmx5OiAzMiBieXRlcyBvciBsb25nZXIh", "label": "Example partner"}]}`

// The server verifies signed requests with the Gin middleware; the client
// signs with replay.Transport, a fresh nonce per request. A captured
// request sent again is refused.
func ExampleSignatureGuard_RequireSignature() {
	gin.SetMode(gin.ReleaseMode) // no debug output

	// Server side.
	keys, err := replay.ParseKeys([]byte(exampleKeys))
	if err != nil {
		fmt.Println(err)
		return
	}
	st := memory.New() // or redisstore.New(client): the store tokens use
	defer st.Close()
	guard := handlers.NewSignatureGuard(replay.NewVerifier(keys, st))
	r := gin.New()
	r.POST("/v1/orders", guard.RequireSignature(), func(c *gin.Context) {
		sig, _ := handlers.SignatureFrom(c.Request.Context())
		body, _ := io.ReadAll(c.Request.Body)
		c.String(http.StatusCreated, "order %s from %s", body, sig.KeyID)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	// Client side: the shared secret, as in the keys file.
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, []byte("example only: 32 bytes or longer!"))
	if err != nil {
		fmt.Println(err)
		return
	}
	var captured *http.Request
	client := &http.Client{Transport: &replay.Transport{Signer: signer, Base: capture{&captured}}}
	for range 2 {
		resp, err := client.Post(srv.URL+"/v1/orders?id=7", "application/json", strings.NewReader(`{"item":"book"}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body))
	}

	// An attacker sends the last signed request again.
	again := captured.Clone(captured.Context())
	again.Body, _ = captured.GetBody()
	resp, err := http.DefaultTransport.RoundTrip(again)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var p handlers.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	fmt.Println(resp.StatusCode, p.Code)
	// Output:
	// 201 order {"item":"book"} from partner-1
	// 201 order {"item":"book"} from partner-1
	// 401 replayed_request
}

// capture is a RoundTripper that remembers the last (signed) request it
// sends.
type capture struct{ last **http.Request }

func (c capture) RoundTrip(req *http.Request) (*http.Response, error) {
	*c.last = req
	return http.DefaultTransport.RoundTrip(req)
}

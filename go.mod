module github.com/replayguard/replayguard

go 1.26.8

require (
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.16.0
)

require github.com/stretchr/testify v1.12.1 // indirect

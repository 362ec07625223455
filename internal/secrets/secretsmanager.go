package secrets

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// SecretsManagerAPI is the one call the fetcher makes.
type SecretsManagerAPI interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// SecretsManager returns a Fetcher that reads the current version of the
// secret whose ARN is the reference.
func SecretsManager(api SecretsManagerAPI) Fetcher {
	return func(ctx context.Context, arn string) (string, error) {
		out, err := api.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: &arn})
		if err != nil {
			return "", fmt.Errorf("GetSecretValue %s: %w", arn, err)
		}
		if out.SecretString == nil {
			return "", errors.New("the secret has no string value: store the signing secret as text")
		}
		return *out.SecretString, nil
	}
}
